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

/// CDB and parameter data fields, each defined once: the target's
/// decoders read them and the initiator's builders (`initiator`) write
/// them, so no handler indexes a CDB by number. Offsets and bits are those
/// of SPC-4 / SBC-4; a field shared by a family of CDBs is named once.
pub mod field {
    use bw_wire::{Bits, Field, Flag, U24};

    /// Byte 0 of every CDB.
    pub const OPERATION_CODE: Field<u8> = Field::at(0);
    /// The operation code's GROUP CODE (SPC-4 4.2.5.1): it implies the CDB
    /// length and, for the block commands, where LBA and length are.
    pub const GROUP_CODE: Bits = Bits::at(0, 0xe0);
    /// Byte 1 of SERVICE ACTION IN/OUT, MAINTENANCE IN/OUT, PERSISTENT
    /// RESERVE IN/OUT CDBs.
    pub const SERVICE_ACTION: Bits = Bits::at(1, 0x1f);

    // ---- block commands (SBC-4 5) ----
    /// RDPROTECT / WRPROTECT / VRPROTECT of READ, WRITE, VERIFY, WRITE
    /// SAME, COMPARE AND WRITE (10/12/16): protection information, which
    /// these disks do not have.
    pub const PROTECT: Bits = Bits::at(1, 0xe0);
    /// Force unit access: the data reaches the medium before the command
    /// completes (not in the 6-byte CDBs).
    pub const FUA: Flag = Flag::at(1, 0x08);
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
    /// WRITE SAME (10/16) flags.
    pub const WRITE_SAME_ANCHOR: Flag = Flag::at(1, 0x10);
    pub const WRITE_SAME_UNMAP: Flag = Flag::at(1, 0x08);
    /// PBDATA and LBDATA (obsolete in SBC-4).
    pub const WRITE_SAME_PB_LB_DATA: Bits = Bits::at(1, 0x06);
    /// No data-out buffer: the block is zeroes (WRITE SAME(16) only).
    pub const WRITE_SAME_NDOB: Flag = Flag::at(1, 0x01);
    /// COMPARE AND WRITE: NUMBER OF LOGICAL BLOCKS (the LBA is LBA_16).
    pub const COMPARE_AND_WRITE_BLOCKS: Field<u8> = Field::at(13);
    /// READ CAPACITY(10): partial medium indicator (with it, the LBA field
    /// may be non-zero).
    pub const READ_CAPACITY_10_PMI: Flag = Flag::at(8, 0x01);
    /// SERVICE ACTION IN(16): allocation length (READ CAPACITY(16), GET LBA STATUS).
    pub const SAI_ALLOCATION_LENGTH: Field<u32> = Field::at(10);
    /// GET LBA STATUS: REPORT TYPE (SBC-4 r20; the starting LBA is LBA_16).
    pub const GET_LBA_STATUS_REPORT_TYPE: Bits = Bits::at(14, 0x07);

    /// UNMAP CDB: ANCHOR, and the parameter list length.
    pub const UNMAP_ANCHOR: Flag = Flag::at(1, 0x01);
    pub const UNMAP_PARAMETER_LIST_LENGTH: Field<u16> = Field::at(7);
    /// UNMAP parameter list (SBC-4 5.32.2): a header, then block
    /// descriptors of UNMAP_DESCRIPTOR_LEN bytes.
    pub const UNMAP_DATA_LENGTH: Field<u16> = Field::at(0);
    pub const UNMAP_BLOCK_DESCRIPTOR_DATA_LENGTH: Field<u16> = Field::at(2);
    pub const UNMAP_HEADER_LEN: usize = 8;
    pub const UNMAP_DESCRIPTOR_LEN: usize = 16;
    /// In one block descriptor.
    pub const UNMAP_DESCRIPTOR_LBA: Field<u64> = Field::at(0);
    pub const UNMAP_DESCRIPTOR_BLOCKS: Field<u32> = Field::at(8);

    /// READ CAPACITY(16) parameter data: the last LBA and the logical
    /// block length.
    pub const RC16_LAST_LBA: Field<u64> = Field::at(0);
    pub const RC16_BLOCK_LENGTH: Field<u32> = Field::at(8);

    // ---- primary commands (SPC-4 6) ----
    /// INQUIRY: enable vital product data, the obsolete CMDDT bit beside
    /// it (byte 1's other bits are reserved), the VPD page wanted and the
    /// allocation length.
    pub const INQUIRY_EVPD: Flag = Flag::at(1, 0x01);
    pub const INQUIRY_CMDDT: Flag = Flag::at(1, 0x02);
    pub const INQUIRY_PAGE_CODE: Field<u8> = Field::at(2);
    pub const INQUIRY_ALLOCATION_LENGTH: Field<u16> = Field::at(3);
    /// REQUEST SENSE: descriptor-format sense data wanted.
    pub const REQUEST_SENSE_DESC: Flag = Flag::at(1, 0x01);
    /// START STOP UNIT: POWER CONDITION.
    pub const START_STOP_POWER_CONDITION: Bits = Bits::at(4, 0xf0);
    /// PREVENT ALLOW MEDIUM REMOVAL: PREVENT.
    pub const PREVENT: Bits = Bits::at(4, 0x03);
    /// RESERVE(6): the obsolete extent reservation bit.
    pub const RESERVE_6_EXTENT: Flag = Flag::at(1, 0x01);
    /// MODE SENSE (6/10): disable block descriptors, long LBA descriptors
    /// accepted (10 only), page control, page and subpage.
    pub const MODE_SENSE_DBD: Flag = Flag::at(1, 0x08);
    pub const MODE_SENSE_LLBAA: Flag = Flag::at(1, 0x10);
    pub const MODE_SENSE_PC: Bits = Bits::at(2, 0xc0);
    /// Page code and subpage of MODE SENSE and LOG SENSE.
    pub const PAGE_CODE: Bits = Bits::at(2, 0x3f);
    pub const SUBPAGE_CODE: Field<u8> = Field::at(3);
    /// MODE SELECT (6/10): page format, save pages, parameter list length.
    pub const MODE_SELECT_PF: Flag = Flag::at(1, 0x10);
    pub const MODE_SELECT_SP: Flag = Flag::at(1, 0x01);
    pub const MODE_SELECT_6_LENGTH: Field<u8> = Field::at(4);
    pub const MODE_SELECT_10_LENGTH: Field<u16> = Field::at(7);
    /// LOG SENSE: save parameters, parameter pointer (page code and
    /// subpage as above).
    pub const LOG_SENSE_SP: Flag = Flag::at(1, 0x01);
    pub const LOG_SENSE_PARAMETER_POINTER: Field<u16> = Field::at(5);
    /// REPORT LUNS: SELECT REPORT and the allocation length.
    pub const REPORT_LUNS_SELECT: Field<u8> = Field::at(2);
    pub const REPORT_LUNS_ALLOCATION_LENGTH: Field<u32> = Field::at(6);
    /// REPORT TARGET PORT GROUPS: PARAMETER DATA FORMAT.
    pub const RTPG_DATA_FORMAT: Bits = Bits::at(1, 0xe0);
    /// REPORT SUPPORTED OPERATION CODES: return command timeouts
    /// descriptor, reporting options, the requested operation code and
    /// service action.
    pub const RSOC_RCTD: Flag = Flag::at(2, 0x80);
    pub const RSOC_REPORTING_OPTIONS: Bits = Bits::at(2, 0x07);
    pub const RSOC_REQUESTED_OPCODE: Field<u8> = Field::at(3);
    pub const RSOC_REQUESTED_SERVICE_ACTION: Field<u16> = Field::at(4);
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS: return extended parameter data.
    pub const RSTMF_REPD: Flag = Flag::at(2, 0x80);
}

/// Where in a CDB a field is, as INVALID FIELD IN CDB's sense-key specific
/// bytes point at it (SPC-4 4.5.2.4.2): its first byte, and for a field
/// smaller than a byte its most significant bit.
pub trait FieldPointer {
    fn pointer(&self) -> (u16, Option<u8>);
}

impl FieldPointer for bw_wire::Bits {
    fn pointer(&self) -> (u16, Option<u8>) {
        (self.offset() as u16, Some(7 - self.mask().leading_zeros() as u8))
    }
}

impl FieldPointer for bw_wire::Flag {
    fn pointer(&self) -> (u16, Option<u8>) {
        (self.offset() as u16, Some(self.bit().trailing_zeros() as u8))
    }
}

impl<C: bw_wire::Codec> FieldPointer for bw_wire::Field<C> {
    fn pointer(&self) -> (u16, Option<u8>) {
        (self.offset() as u16, None)
    }
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
