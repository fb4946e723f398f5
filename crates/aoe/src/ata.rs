//! The ATA command argument (12 bytes at offset 24) and the ATA constants a
//! target needs.
//!
//! Layout: aflags, err/feature, sector count, cmd/status, LBA bytes 0..5
//! (least significant first), 2 reserved. Sector data follows at offset 36.

use crate::{need, need_out, WireError, ATA_HEADER_LEN};

/// The argument's fields, at their offsets in the frame, each defined once
/// for [`AtaArg::parse`] and [`AtaArg::encode`].
pub mod field {
    use bw_wire::Field;
    pub const AFLAGS: Field<u8> = Field::at(24);
    pub const ERR_FEATURE: Field<u8> = Field::at(25);
    pub const SECTOR_COUNT: Field<u8> = Field::at(26);
    pub const CMD_STATUS: Field<u8> = Field::at(27);
    pub const LBA: Field<[u8; 6]> = Field::at(28);
    pub const RESERVED: Field<u16> = Field::at(34);
    const _: () = assert!(AFLAGS.offset() == crate::HEADER_LEN && RESERVED.end() == crate::ATA_HEADER_LEN);
}

/// aflags bits.
pub const AFLAG_EXTENDED: u8 = 0x40; // LBA48
pub const AFLAG_DEVICE: u8 = 0x10;
pub const AFLAG_ASYNC: u8 = 0x02;
pub const AFLAG_WRITE: u8 = 0x01;

/// ATA commands blockwire's target implements.
pub const CMD_READ_SECTORS: u8 = 0x20;
pub const CMD_READ_SECTORS_EXT: u8 = 0x24;
pub const CMD_WRITE_SECTORS: u8 = 0x30;
pub const CMD_WRITE_SECTORS_EXT: u8 = 0x34;
pub const CMD_CHECK_POWER_MODE: u8 = 0xE5;
pub const CMD_FLUSH_CACHE: u8 = 0xE7;
pub const CMD_FLUSH_CACHE_EXT: u8 = 0xEA;
pub const CMD_IDENTIFY_DEVICE: u8 = 0xEC;

/// Status register bits.
pub const STATUS_BSY: u8 = 0x80;
pub const STATUS_DRDY: u8 = 0x40;
pub const STATUS_DF: u8 = 0x20;
pub const STATUS_DRQ: u8 = 0x08;
pub const STATUS_ERR: u8 = 0x01;
/// The bits the Linux driver treats as failure.
pub const STATUS_FAILURE_MASK: u8 = STATUS_BSY | STATUS_DF | STATUS_DRQ | STATUS_ERR;

/// Error register bits.
pub const ERR_ABRT: u8 = 0x04; // command aborted (unsupported, read-only, write fault)
pub const ERR_IDNF: u8 = 0x10; // address not found (LBA past the end)
pub const ERR_UNC: u8 = 0x40; // uncorrectable data (read I/O error)

/// CHECK POWER MODE answer in the sector count: active or idle.
pub const POWER_MODE_ACTIVE: u8 = 0xFF;

/// Decoded ATA argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtaArg {
    pub aflags: u8,
    /// Feature on request, error register on response.
    pub err_feature: u8,
    pub sector_count: u8,
    /// Command on request, status register on response.
    pub cmd_status: u8,
    /// The six LBA bytes as sent, least significant first.
    pub lba_bytes: [u8; 6],
}

impl AtaArg {
    /// Decode the argument of a frame (the full frame, header included).
    pub fn parse(frame: &[u8]) -> Result<AtaArg, WireError> {
        need(frame, ATA_HEADER_LEN)?;
        Ok(AtaArg {
            aflags: field::AFLAGS.get(frame),
            err_feature: field::ERR_FEATURE.get(frame),
            sector_count: field::SECTOR_COUNT.get(frame),
            cmd_status: field::CMD_STATUS.get(frame),
            lba_bytes: field::LBA.get(frame),
        })
    }

    /// Encode into bytes 24..36 of `frame`.
    pub fn encode(&self, frame: &mut [u8]) -> Result<(), WireError> {
        need_out(frame, ATA_HEADER_LEN)?;
        field::AFLAGS.set(frame, self.aflags);
        field::ERR_FEATURE.set(frame, self.err_feature);
        field::SECTOR_COUNT.set(frame, self.sector_count);
        field::CMD_STATUS.set(frame, self.cmd_status);
        field::LBA.set(frame, self.lba_bytes);
        field::RESERVED.set(frame, 0);
        Ok(())
    }

    pub fn is_extended(&self) -> bool {
        self.aflags & AFLAG_EXTENDED != 0
    }
    pub fn is_write(&self) -> bool {
        self.aflags & AFLAG_WRITE != 0
    }

    /// The LBA the command addresses: 48 bits with the E flag, else 28 bits
    /// (the low nibble of LBA byte 3 is LBA 24..27; its high nibble is the
    /// device register, 0xE0 from Linux).
    pub fn lba(&self) -> u64 {
        let b = &self.lba_bytes;
        if self.is_extended() {
            u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], 0, 0])
        } else {
            u64::from_le_bytes([b[0], b[1], b[2], b[3] & 0x0F, 0, 0, 0, 0])
        }
    }

    /// LBA bytes for `lba`, the way the Linux driver fills them: all six
    /// bytes for LBA48, else 28 bits with 0xE0 (LBA mode) in byte 3's high nibble.
    pub fn lba_bytes_for(lba: u64, extended: bool) -> [u8; 6] {
        let b = lba.to_le_bytes();
        if extended {
            [b[0], b[1], b[2], b[3], b[4], b[5]]
        } else {
            [b[0], b[1], b[2], 0xE0 | (b[3] & 0x0F), 0, 0]
        }
    }

    /// Whether the response status reports failure (what Linux checks).
    pub fn failed(&self) -> bool {
        self.cmd_status & STATUS_FAILURE_MASK != 0
    }
}

/// Human-readable ATA error, for initiator-side messages.
pub fn describe_ata_error(status: u8, err: u8) -> String {
    let mut parts = Vec::new();
    for (bit, name) in [(ERR_ABRT, "ABRT"), (ERR_IDNF, "IDNF"), (ERR_UNC, "UNC")] {
        if err & bit != 0 {
            parts.push(name);
        }
    }
    format!("ATA status {status:#04x} error {err:#04x} ({})", if parts.is_empty() { "-".into() } else { parts.join("|") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_with_arg(arg: [u8; 12]) -> Vec<u8> {
        let mut f = vec![0u8; 36];
        f[12] = 0x88;
        f[13] = 0xa2;
        f[24..36].copy_from_slice(&arg);
        f
    }

    #[test]
    fn read_ext_as_linux_sends_it() {
        // aflags E, scnt 2, READ SECTORS EXT, LBA 0x0000_0123_4567 LE.
        let f = frame_with_arg([0x40, 0, 2, 0x24, 0x67, 0x45, 0x23, 0x01, 0, 0, 0, 0]);
        let a = AtaArg::parse(&f).unwrap();
        assert!(a.is_extended() && !a.is_write());
        assert_eq!(a.sector_count, 2);
        assert_eq!(a.cmd_status, CMD_READ_SECTORS_EXT);
        assert_eq!(a.lba(), 0x0123_4567);
    }

    #[test]
    fn lba28_masks_the_device_register() {
        // WRITE SECTORS, LBA28 0x0ABCDEF with 0xE0 in byte 3, junk in bytes 4-5.
        let f = frame_with_arg([0x01, 0, 1, 0x30, 0xEF, 0xCD, 0xAB, 0xE0, 0x77, 0x77, 0, 0]);
        let a = AtaArg::parse(&f).unwrap();
        assert!(a.is_write() && !a.is_extended());
        assert_eq!(a.lba(), 0x00AB_CDEF);
        assert_eq!(AtaArg::lba_bytes_for(0x0FAB_CDEF, false), [0xEF, 0xCD, 0xAB, 0xEF, 0, 0]);
    }

    #[test]
    fn encode_writes_exact_bytes() {
        let a = AtaArg { aflags: 0x41, err_feature: 0, sector_count: 17, cmd_status: 0x34, lba_bytes: [1, 2, 3, 4, 5, 6] };
        let mut f = vec![0xAAu8; 40];
        a.encode(&mut f).unwrap();
        assert_eq!(&f[24..36], &[0x41, 0, 17, 0x34, 1, 2, 3, 4, 5, 6, 0, 0]);
        assert_eq!(f[36], 0xAA);
        assert!(AtaArg::parse(&f[..35]).is_err());
        assert!(a.encode(&mut [0u8; 30]).is_err());
    }

    #[test]
    fn failure_bits_are_the_linux_mask() {
        let mut a = AtaArg { cmd_status: STATUS_DRDY, ..Default::default() };
        assert!(!a.failed());
        a.cmd_status = STATUS_DRDY | STATUS_ERR;
        assert!(a.failed());
        assert!(describe_ata_error(0x41, ERR_IDNF).contains("IDNF"));
    }

    proptest! {
        #[test]
        fn arg_round_trips(aflags in any::<u8>(), ef in any::<u8>(), sc in any::<u8>(), cs in any::<u8>(), lba in any::<[u8;6]>()) {
            let a = AtaArg { aflags, err_feature: ef, sector_count: sc, cmd_status: cs, lba_bytes: lba };
            let mut f = [0u8; 36];
            a.encode(&mut f).unwrap();
            prop_assert_eq!(AtaArg::parse(&f).unwrap(), a);
        }

        #[test]
        fn lba_round_trips(lba in 0u64..(1 << 48), ext in any::<bool>()) {
            let lba = if ext { lba } else { lba & 0x0FFF_FFFF };
            let a = AtaArg { aflags: if ext { AFLAG_EXTENDED } else { 0 }, lba_bytes: AtaArg::lba_bytes_for(lba, ext), ..Default::default() };
            prop_assert_eq!(a.lba(), lba);
        }
    }
}
