//! Query Config argument (offset 24): buffer count (u16), firmware version
//! (u16), sector count (u8), AoE version (high nibble) + ccmd (low nibble),
//! config string length (u16), config string.

use crate::{need, need_out, WireError, AOE_VERSION, HEADER_LEN, MAX_CONFIG_STRING};

pub const QC_ARG_LEN: usize = 8;

/// Config string sub-commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigCommand {
    /// Read the config string.
    Read,
    /// Reply only if the string matches exactly.
    TestExact,
    /// Reply only if the request string is a prefix of the config string.
    TestPrefix,
    /// Set the string if it is empty, else fail with error 4.
    SetIfEmpty,
    /// Set the string unconditionally.
    ForceSet,
}

impl ConfigCommand {
    pub fn from_u8(v: u8) -> Option<ConfigCommand> {
        Some(match v {
            0 => ConfigCommand::Read,
            1 => ConfigCommand::TestExact,
            2 => ConfigCommand::TestPrefix,
            3 => ConfigCommand::SetIfEmpty,
            4 => ConfigCommand::ForceSet,
            _ => return None,
        })
    }
    pub fn to_u8(self) -> u8 {
        match self {
            ConfigCommand::Read => 0,
            ConfigCommand::TestExact => 1,
            ConfigCommand::TestPrefix => 2,
            ConfigCommand::SetIfEmpty => 3,
            ConfigCommand::ForceSet => 4,
        }
    }
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
        let a = &frame[HEADER_LEN..];
        let len = u16::from_be_bytes([a[6], a[7]]) as usize;
        if len > MAX_CONFIG_STRING {
            return Err(WireError::BadArg("config string longer than 1024 bytes"));
        }
        need(a, QC_ARG_LEN + len)?;
        Ok(QueryConfig {
            buffer_count: u16::from_be_bytes([a[0], a[1]]),
            firmware_version: u16::from_be_bytes([a[2], a[3]]),
            sector_count: a[4],
            aoe_version: a[5] >> 4,
            ccmd: a[5] & 0x0F,
            config: &a[QC_ARG_LEN..QC_ARG_LEN + len],
        })
    }

    pub fn command(&self) -> Option<ConfigCommand> {
        ConfigCommand::from_u8(self.ccmd)
    }

    /// Encode after a header already in `frame`; returns the frame length.
    pub fn encode(&self, frame: &mut [u8]) -> Result<usize, WireError> {
        if self.config.len() > MAX_CONFIG_STRING {
            return Err(WireError::BadArg("config string longer than 1024 bytes"));
        }
        let end = HEADER_LEN + QC_ARG_LEN + self.config.len();
        need_out(frame, end)?;
        let a = &mut frame[HEADER_LEN..end];
        a[0..2].copy_from_slice(&self.buffer_count.to_be_bytes());
        a[2..4].copy_from_slice(&self.firmware_version.to_be_bytes());
        a[4] = self.sector_count;
        a[5] = (self.aoe_version << 4) | (self.ccmd & 0x0F);
        a[6..8].copy_from_slice(&(self.config.len() as u16).to_be_bytes());
        a[8..].copy_from_slice(self.config);
        Ok(end)
    }

    /// A request as an initiator sends it (counts zero, our version).
    pub fn request(cmd: ConfigCommand, config: &'a [u8]) -> Self {
        QueryConfig { buffer_count: 0, firmware_version: 0, sector_count: 0, aoe_version: AOE_VERSION, ccmd: cmd.to_u8(), config }
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
        assert_eq!(ConfigCommand::from_u8(5), None);
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
