//! CDB field access and the operation codes this disk implements.

/// The control byte's NACA and LINK bits (SAM-5 5.2), the last byte of
/// every CDB. Neither is supported: a command with either set fails.
pub const CONTROL_NACA_LINK: u8 = 0x05;

/// Whether the `len`-byte CDB `cdb` asks for NACA or LINK.
#[inline]
pub fn naca_or_link(cdb: &[u8], len: usize) -> bool {
    cdb[len - 1] & CONTROL_NACA_LINK != 0
}

pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNC_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const LOG_SENSE: u8 = 0x4D;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PR_IN: u8 = 0x5E;
    pub const PR_OUT: u8 = 0x5F;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const WRITE_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNC_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;

    /// Service actions.
    pub const SAI_READ_CAPACITY_16: u8 = 0x10;
    pub const SAI_GET_LBA_STATUS: u8 = 0x12;
    pub const MI_REPORT_TARGET_PORT_GROUPS: u8 = 0x0A;
    pub const MI_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
    pub const MI_REPORT_SUPPORTED_TMF: u8 = 0x0D;
}

/// CDB and parameter data fields that both an initiator (the builders in
/// `initiator`) and this target (the decoders) use, each defined once.
pub mod field {
    use bw_wire::{Bits, Field, U24};

    /// Byte 1 of SERVICE ACTION IN/OUT, MAINTENANCE IN/OUT, PERSISTENT
    /// RESERVE IN/OUT CDBs.
    pub const SERVICE_ACTION: Bits = Bits::at(1, 0x1f);
    /// VERIFY and WRITE AND VERIFY: byte check mode.
    pub const BYTCHK: Bits = Bits::at(1, 0x06);

    /// READ/WRITE(6): 21-bit LBA (the top bits of byte 1 are reserved) and
    /// transfer length (0 means 256 blocks).
    pub const LBA_6: Field<U24> = Field::at(1);
    pub const LBA_6_MASK: u32 = 0x1f_ffff;
    pub const BLOCKS_6: Field<u8> = Field::at(4);
    /// Group 1 and 2 (10-byte) block commands.
    pub const LBA_10: Field<u32> = Field::at(2);
    pub const BLOCKS_10: Field<u16> = Field::at(7);
    /// Group 5 (12-byte) block commands.
    pub const LBA_12: Field<u32> = Field::at(2);
    pub const BLOCKS_12: Field<u32> = Field::at(6);
    /// Group 4 (16-byte) block commands.
    pub const LBA_16: Field<u64> = Field::at(2);
    pub const BLOCKS_16: Field<u32> = Field::at(10);
    /// SERVICE ACTION IN(16): allocation length (READ CAPACITY(16), GET LBA STATUS).
    pub const SAI_ALLOCATION_LENGTH: Field<u32> = Field::at(10);

    /// READ CAPACITY(16) parameter data: the last LBA and the logical
    /// block length.
    pub const RC16_LAST_LBA: Field<u64> = Field::at(0);
    pub const RC16_BLOCK_LENGTH: Field<u32> = Field::at(8);
}

/// CDB length implied by the operation code's group (SPC-4 4.2.5.1).
pub fn cdb_len(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 6,
    }
}

#[inline]
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
#[inline]
pub fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}
#[inline]
pub fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline]
pub fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Allocation-length truncation: commands return at most what the initiator
/// asked for (SPC-4 4.2.5.6), without that being an error.
pub fn truncate_to(data: &mut Vec<u8>, alloc_len: usize) {
    if data.len() > alloc_len {
        data.truncate(alloc_len);
    }
}
