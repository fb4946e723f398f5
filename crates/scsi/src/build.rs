//! CDBs an initiator sends, built in one place from the same opcode table the
//! target decodes with (`op`), so the two sides cannot disagree on a layout.

use crate::cdb::{field, op};

/// TEST UNIT READY (6).
pub fn test_unit_ready() -> [u8; 6] {
    [op::TEST_UNIT_READY, 0, 0, 0, 0, 0]
}

/// READ CAPACITY (16): SERVICE ACTION IN (16) / READ CAPACITY, `alloc` bytes
/// of parameter data (32 is the whole answer).
pub fn read_capacity_16(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    field::SERVICE_ACTION.set(&mut c, op::SAI_READ_CAPACITY_16);
    field::SAI_ALLOCATION_LENGTH.set(&mut c, alloc);
    c
}

fn rw16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    field::LBA_16.set(&mut c, lba);
    field::BLOCKS_16.set(&mut c, blocks);
    c
}

/// READ (16) of `blocks` logical blocks at `lba`.
pub fn read_16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::READ_16, lba, blocks)
}

/// WRITE (16) of `blocks` logical blocks at `lba`.
pub fn write_16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::WRITE_16, lba, blocks)
}

/// SYNCHRONIZE CACHE (10) of the whole medium (LBA 0, 0 blocks = to the end).
pub fn synchronize_cache_10() -> [u8; 10] {
    [op::SYNC_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// The parsed READ CAPACITY (16) answer: (last LBA, logical block length).
/// `None` if `data` is shorter than the 12 bytes that carry them.
pub fn parse_read_capacity_16(data: &[u8]) -> Option<(u64, u32)> {
    Some((field::RC16_LAST_LBA.try_get(data)?, field::RC16_BLOCK_LENGTH.try_get(data)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::{be32, be64};

    #[test]
    fn builders_fill_the_fields_the_target_decodes() {
        let r = read_16(0x0102_0304_0506_0708, 77);
        assert_eq!((r[0], be64(&r, 2), be32(&r, 10)), (0x88, 0x0102_0304_0506_0708, 77));
        let w = write_16(5, 9);
        assert_eq!((w[0], be64(&w, 2), be32(&w, 10)), (0x8A, 5, 9));
        let rc = read_capacity_16(32);
        assert_eq!((rc[0], rc[1] & 0x1f, be32(&rc, 10)), (0x9E, 0x10, 32));
        // Each builder builds a command of the table, with its row's length.
        let built: [&[u8]; 5] = [&test_unit_ready(), &synchronize_cache_10(), &rc, &r, &w];
        for cdb in built {
            let row = crate::commands::command(cdb).expect("a supported command");
            assert_eq!(row.cdb_len(), cdb.len(), "{}", row.name);
        }
    }

    #[test]
    fn read_capacity_answer() {
        let mut d = [0u8; 32];
        d[0..8].copy_from_slice(&1023u64.to_be_bytes());
        d[8..12].copy_from_slice(&4096u32.to_be_bytes());
        assert_eq!(parse_read_capacity_16(&d), Some((1023, 4096)));
        assert_eq!(parse_read_capacity_16(&d[..11]), None);
    }
}
