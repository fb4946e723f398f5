//! ATA over Ethernet (AoE, revision r11): wire format, the ATA command set a
//! target needs, and the target/initiator protocol logic. No sockets here:
//! everything works on byte slices so it can be tested with byte vectors,
//! property tests and fuzzers.
//!
//! - [`frame`]: Ethernet + AoE header view and encoder.
//! - [`ata`], [`query_config`], [`mask`], [`reserve_release`]: the four command arguments.
//! - [`identify`]: the 512-byte IDENTIFY DEVICE page.
//! - [`target`]: per-export state machine: request frame in, reply frame out.
//! - [`initiator`]: request builders, reply parsing, RTT estimator.

pub mod ata;
pub mod frame;
pub mod flow;
pub mod identify;
pub mod initiator;
pub mod mask;
pub mod query_config;
pub mod reserve_release;
pub mod target;

pub use frame::{AoeHeader, Command, ErrorCode, Mac, BROADCAST_MAC};

/// EtherType of AoE frames.
pub const ETHERTYPE_AOE: u16 = 0x88A2;
/// The protocol version we speak (high nibble of byte 14).
pub const AOE_VERSION: u8 = 1;
/// Ethernet header (14) + AoE header (10).
pub const HEADER_LEN: usize = 24;
/// AoE header plus the 12-byte ATA argument: where sector data starts.
pub const ATA_HEADER_LEN: usize = 36;
pub const SECTOR: usize = 512;
/// Frames shorter than this are padded (Ethernet minimum without FCS).
pub const MIN_FRAME: usize = 60;
/// Longest config string Query Config carries.
pub const MAX_CONFIG_STRING: usize = 1024;
/// Broadcast shelf and slot.
pub const BROADCAST_SHELF: u16 = 0xFFFF;
pub const BROADCAST_SLOT: u8 = 0xFF;

/// Sectors one ATA frame can carry at an interface MTU: the Linux driver's
/// `(mtu - 36) / 512` (2 at 1500, 17 at 9000), at most 255.
pub fn max_sectors_for_mtu(mtu: usize) -> u8 {
    (mtu.saturating_sub(ATA_HEADER_LEN) / SECTOR).min(255) as u8
}

/// A frame or argument that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame too short: {have} bytes, need {need}")]
    Truncated { have: usize, need: usize },
    #[error("not an AoE frame (EtherType {0:#06x})")]
    NotAoe(u16),
    #[error("unsupported AoE version {0}")]
    Version(u8),
    #[error("bad argument: {0}")]
    BadArg(&'static str),
    #[error("output buffer too small: {have} bytes, need {need}")]
    BufferTooSmall { have: usize, need: usize },
}

pub(crate) fn need(buf: &[u8], n: usize) -> Result<(), WireError> {
    if buf.len() < n {
        Err(WireError::Truncated { have: buf.len(), need: n })
    } else {
        Ok(())
    }
}

pub(crate) fn need_out(buf: &[u8], n: usize) -> Result<(), WireError> {
    if buf.len() < n {
        Err(WireError::BufferTooSmall { have: buf.len(), need: n })
    } else {
        Ok(())
    }
}

/// Zero-pad a frame of `len` bytes to the Ethernet minimum; returns the new length.
pub fn pad_frame(buf: &mut [u8], len: usize) -> usize {
    if len < MIN_FRAME && buf.len() >= MIN_FRAME {
        buf[len..MIN_FRAME].fill(0);
        MIN_FRAME
    } else {
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sectors_per_mtu_match_the_linux_driver() {
        assert_eq!(max_sectors_for_mtu(1500), 2);
        assert_eq!(max_sectors_for_mtu(9000), 17);
        assert_eq!(max_sectors_for_mtu(30), 0);
        assert_eq!(max_sectors_for_mtu(1 << 20), 255);
    }
}
