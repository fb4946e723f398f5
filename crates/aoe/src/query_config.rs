//! Query Config argument (offset 24): buffer count (u16), firmware version
//! (u16), sector count (u8), AoE version (high nibble) + ccmd (low nibble),
//! config string length (u16), config string.

use crate::{need, need_out, WireError, AOE_VERSION, HEADER_LEN, MAX_CONFIG_STRING};
use num_enum::{IntoPrimitive, TryFromPrimitive};

pub const QC_ARG_LEN: usize = 8;

/// The argument's fields, at their offsets in the frame, each defined once
/// for [`QueryConfig::parse`] and [`QueryConfig::encode`].
pub mod field {
    use bw_wire::{Bits, Field};
    pub const BUFFER_COUNT: Field<u16> = Field::at(24);
    pub const FIRMWARE_VERSION: Field<u16> = Field::at(26);
    pub const SECTOR_COUNT: Field<u8> = Field::at(28);
    pub const AOE_VERSION: Bits = Bits::at(29, 0xf0);
    pub const CCMD: Bits = Bits::at(29, 0x0f);
    pub const CONFIG_LENGTH: Field<u16> = Field::at(30);
    const _: () = assert!(BUFFER_COUNT.offset() == crate::HEADER_LEN && CONFIG_LENGTH.end() == crate::HEADER_LEN + super::QC_ARG_LEN);
}

/// Config string sub-commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, TryFromPrimitive, IntoPrimitive)]
#[repr(u8)]
pub enum ConfigCommand {
    /// Read the config string.
    Read = 0,
    /// Reply only if the string matches exactly.
    TestExact = 1,
    /// Reply only if the request string is a prefix of the config string.
    TestPrefix = 2,
    /// Set the string if it is empty, else fail with error 4.
    SetIfEmpty = 3,
    /// Set the string unconditionally.
    ForceSet = 4,
}


/// A Query Config argument viewed over a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryConfig<'a> {
    pub buffer_count: u16,
    pub firmware_version: u16,
    pub sector_count: u8,
    pub aoe_version: u8,
    /// Raw low nibble; see [`QueryConfig::command`].
    pub ccmd: u8,
    pub config: &'a [u8],
}

impl<'a> QueryConfig<'a> {
    /// Decode from a whole frame. The string length must fit in the frame
    /// and be at most 1024.
    pub fn parse(frame: &'a [u8]) -> Result<Self, WireError> {
        need(frame, HEADER_LEN + QC_ARG_LEN)?;
        let len = field::CONFIG_LENGTH.get(frame) as usize;
        if len > MAX_CONFIG_STRING {
            return Err(WireError::BadArg("config string longer than 1024 bytes"));
        }
        let start = HEADER_LEN + QC_ARG_LEN;
        need(frame, start + len)?;
        Ok(QueryConfig {
            buffer_count: field::BUFFER_COUNT.get(frame),
            firmware_version: field::FIRMWARE_VERSION.get(frame),
            sector_count: field::SECTOR_COUNT.get(frame),
            aoe_version: field::AOE_VERSION.get(frame),
            ccmd: field::CCMD.get(frame),
            config: &frame[start..start + len],
        })
    }

    pub fn command(&self) -> Option<ConfigCommand> {
        ConfigCommand::try_from(self.ccmd).ok()
    }

    /// Encode after a header already in `frame`; returns the frame length.
    pub fn encode(&self, frame: &mut [u8]) -> Result<usize, WireError> {
        if self.config.len() > MAX_CONFIG_STRING {
            return Err(WireError::BadArg("config string longer than 1024 bytes"));
        }
        let end = HEADER_LEN + QC_ARG_LEN + self.config.len();
        need_out(frame, end)?;
        field::BUFFER_COUNT.set(frame, self.buffer_count);
        field::FIRMWARE_VERSION.set(frame, self.firmware_version);
        field::SECTOR_COUNT.set(frame, self.sector_count);
        field::AOE_VERSION.set(frame, self.aoe_version);
        field::CCMD.set(frame, self.ccmd);
        field::CONFIG_LENGTH.set(frame, self.config.len() as u16);
        frame[HEADER_LEN + QC_ARG_LEN..end].copy_from_slice(self.config);
        Ok(end)
    }

    /// A request as an initiator sends it (counts zero, our version).
    pub fn request(cmd: ConfigCommand, config: &'a [u8]) -> Self {
        QueryConfig { buffer_count: 0, firmware_version: 0, sector_count: 0, aoe_version: AOE_VERSION, ccmd: cmd.into(), config }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_a_reply_byte_vector() {
        let mut f = vec![0u8; 24];
        f[12] = 0x88;
        f[13] = 0xa2;
        f.extend_from_slice(&[0x00, 0x40, 0x40, 0x01, 17, 0x10, 0x00, 0x03, b'a', b'b', b'c']);
        let q = QueryConfig::parse(&f).unwrap();
        assert_eq!(q.buffer_count, 64);
        assert_eq!(q.firmware_version, 0x4001);
        assert_eq!(q.sector_count, 17);
        assert_eq!(q.aoe_version, 1);
        assert_eq!(q.command(), Some(ConfigCommand::Read));
        assert_eq!(q.config, b"abc");
        let mut out = vec![0u8; 64];
        let n = q.encode(&mut out).unwrap();
        assert_eq!(&out[24..n], &f[24..]);
    }

    #[test]
    fn rejects_lying_lengths() {
        let mut f = vec![0u8; 32];
        f[30] = 0x00;
        f[31] = 0x05; // says 5 bytes, has none
        assert!(matches!(QueryConfig::parse(&f), Err(WireError::Truncated { .. })));
        f[30] = 0x04;
        f[31] = 0x01; // 1025
        f.resize(32 + 1025, 0);
        assert_eq!(QueryConfig::parse(&f), Err(WireError::BadArg("config string longer than 1024 bytes")));
        assert!(QueryConfig::parse(&f[..31]).is_err());
        assert!(ConfigCommand::try_from(5).is_err());
    }

    proptest! {
        #[test]
        fn round_trips(bc in any::<u16>(), fw in any::<u16>(), sc in any::<u8>(), ccmd in 0u8..16,
                       s in proptest::collection::vec(any::<u8>(), 0..1025)) {
            let q = QueryConfig { buffer_count: bc, firmware_version: fw, sector_count: sc, aoe_version: 1, ccmd, config: &s };
            let mut buf = vec![0u8; 24 + 8 + 1024];
            let n = q.encode(&mut buf).unwrap();
            prop_assert_eq!(QueryConfig::parse(&buf[..n]).unwrap(), q);
        }
    }
}
