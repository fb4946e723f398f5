//! CDBs an initiator sends, built in one place from the same opcode table the
//! target decodes with (`op`), so the two sides cannot disagree on a layout.

use crate::cdb::op;

/// TEST UNIT READY (6).
pub fn test_unit_ready() -> [u8; 6] {
    [op::TEST_UNIT_READY, 0, 0, 0, 0, 0]
}

/// READ CAPACITY (16): SERVICE ACTION IN (16) / READ CAPACITY, `alloc` bytes
/// of parameter data (32 is the whole answer).
pub fn read_capacity_16(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = op::SAI_READ_CAPACITY_16;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

fn rw16(opcode: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
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
    let last_lba = u64::from_be_bytes(data.get(0..8)?.try_into().ok()?);
    let block = u32::from_be_bytes(data.get(8..12)?.try_into().ok()?);
    Some((last_lba, block))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::{be32, be64, cdb_len};

    #[test]
    fn builders_fill_the_fields_the_target_decodes() {
        let r = read_16(0x0102_0304_0506_0708, 77);
        assert_eq!((r[0], be64(&r, 2), be32(&r, 10)), (0x88, 0x0102_0304_0506_0708, 77));
        let w = write_16(5, 9);
        assert_eq!((w[0], be64(&w, 2), be32(&w, 10)), (0x8A, 5, 9));
        let rc = read_capacity_16(32);
        assert_eq!((rc[0], rc[1] & 0x1f, be32(&rc, 10)), (0x9E, 0x10, 32));
        // Each builder's length is what the opcode group says.
        assert_eq!(cdb_len(test_unit_ready()[0]), test_unit_ready().len());
        assert_eq!(cdb_len(synchronize_cache_10()[0]), synchronize_cache_10().len());
        assert_eq!(cdb_len(rc[0]), rc.len());
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
