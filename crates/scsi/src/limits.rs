//! What this target accepts of one command: the Block Limits VPD page
//! (0xB0) reports these, the commands enforce them, and transports refuse
//! larger transfers before receiving them.

/// Block limits (units of 512-byte blocks).
pub const MAX_TRANSFER_BLOCKS: u32 = 8192; // 4 MiB per command
pub const OPTIMAL_TRANSFER_BLOCKS: u32 = 2048; // 1 MiB
pub const OPTIMAL_GRANULARITY_BLOCKS: u16 = 8; // 4 KiB pages underneath
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
pub const MAX_WRITE_SAME_BLOCKS: u64 = 0xffff; // as LIO: 32 MiB - 512
pub const MAX_COMPARE_AND_WRITE_BLOCKS: u8 = 255;

/// The most data-out any command accepts, in bytes: a WRITE of the
/// MAXIMUM TRANSFER LENGTH in the Block Limits VPD page (parameter lists and
/// COMPARE AND WRITE are smaller). Transports refuse larger transfers
/// before receiving them.
pub const MAX_DATA_OUT_BYTES: u32 = MAX_TRANSFER_BLOCKS * 512;
