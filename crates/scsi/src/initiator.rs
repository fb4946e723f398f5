//! The initiator's side of SCSI: the CDBs it sends and the parameter data it
//! reads back, built in one place from the same opcode table the target
//! decodes with (`op`), so the two sides cannot disagree on a layout.

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
    field::OPERATION_CODE.set(&mut c, opcode);
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

/// INQUIRY for vital product data page `page`, at most `alloc` bytes back.
pub fn inquiry_vpd(page: u8, alloc: u16) -> [u8; 6] {
    let mut c = [op::INQUIRY, 0, 0, 0, 0, 0];
    field::INQUIRY_EVPD.set(&mut c, true);
    field::INQUIRY_PAGE_CODE.set(&mut c, page);
    field::INQUIRY_ALLOCATION_LENGTH.set(&mut c, alloc);
    c
}

/// UNMAP with a parameter list of `param_len` bytes (see [`unmap_parameters`]).
pub fn unmap(param_len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = op::UNMAP;
    field::UNMAP_PARAMETER_LIST_LENGTH.set(&mut c, param_len);
    c
}

/// UNMAP parameter list: header and one 16-byte block descriptor per
/// (LBA, number of blocks).
pub fn unmap_parameters(ranges: &[(u64, u32)]) -> Vec<u8> {
    use field::*;
    let descriptors = ranges.len() * UNMAP_DESCRIPTOR_LEN;
    let mut p = vec![0u8; UNMAP_HEADER_LEN + descriptors];
    // The data length counts the bytes after itself.
    let data_length = (p.len() - UNMAP_DATA_LENGTH.end()) as u16;
    UNMAP_DATA_LENGTH.set(&mut p, data_length);
    UNMAP_BLOCK_DESCRIPTOR_DATA_LENGTH.set(&mut p, descriptors as u16);
    for (d, &(lba, blocks)) in p[UNMAP_HEADER_LEN..].chunks_exact_mut(UNMAP_DESCRIPTOR_LEN).zip(ranges) {
        UNMAP_DESCRIPTOR_LBA.set(d, lba);
        UNMAP_DESCRIPTOR_BLOCKS.set(d, blocks);
    }
    p
}

/// VPD pages a thin-provisioning-aware initiator reads.
pub mod vpd {
    /// Block Limits.
    pub const BLOCK_LIMITS: u8 = 0xB0;
    /// Logical Block Provisioning.
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xB2;
}

/// LBPME (logical block provisioning management enabled) from a READ
/// CAPACITY (16) answer.
pub fn parse_lbpme(read_capacity_16: &[u8]) -> bool {
    read_capacity_16.get(14).is_some_and(|b| b & 0x80 != 0)
}

/// LBPU (UNMAP supported) from the Logical Block Provisioning VPD page.
pub fn parse_lbpu(vpd_b2: &[u8]) -> bool {
    vpd_b2.get(1) == Some(&vpd::LOGICAL_BLOCK_PROVISIONING) && vpd_b2.get(5).is_some_and(|b| b & 0x80 != 0)
}

/// (MAXIMUM UNMAP LBA COUNT, MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT) from the
/// Block Limits VPD page; `None` if the page is too short to carry them.
pub fn parse_unmap_limits(vpd_b0: &[u8]) -> Option<(u32, u32)> {
    if vpd_b0.get(1) != Some(&vpd::BLOCK_LIMITS) {
        return None;
    }
    let lba = u32::from_be_bytes(vpd_b0.get(20..24)?.try_into().ok()?);
    let desc = u32::from_be_bytes(vpd_b0.get(24..28)?.try_into().ok()?);
    Some((lba, desc))
}

/// The parsed READ CAPACITY (16) answer: (last LBA, logical block length).
/// `None` if `data` is shorter than the 12 bytes that carry them.
pub fn parse_read_capacity_16(data: &[u8]) -> Option<(u64, u32)> {
    Some((field::RC16_LAST_LBA.try_get(data)?, field::RC16_BLOCK_LENGTH.try_get(data)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::{be16, be32, be64};

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
    fn unmap_cdb_and_parameters_have_the_layout_the_target_decodes() {
        let p = unmap_parameters(&[(7, 9), (1 << 40, 3)]);
        assert_eq!(p.len(), 8 + 32);
        assert_eq!((be16(&p, 0), be16(&p, 2)), (38, 32));
        assert_eq!((be64(&p, 8), be32(&p, 16)), (7, 9));
        assert_eq!((be64(&p, 24), be32(&p, 32)), (1 << 40, 3));
        let c = unmap(p.len() as u16);
        let len = |cdb: &[u8]| crate::commands::command(cdb).expect("a supported command").cdb_len();
        assert_eq!((c[0], be16(&c, 7), len(&c)), (0x42, 40, c.len()));
        let i = inquiry_vpd(vpd::BLOCK_LIMITS, 64);
        assert_eq!((i[0], i[1] & 1, i[2], be16(&i, 3), len(&i)), (0x12, 1, 0xB0, 64, i.len()));
    }

    #[test]
    fn provisioning_answers() {
        let mut rc = [0u8; 32];
        assert!(!parse_lbpme(&rc));
        rc[14] = 0x80;
        assert!(parse_lbpme(&rc));
        assert!(parse_lbpu(&[0, 0xB2, 0, 4, 0, 0x80, 0, 0]));
        assert!(!parse_lbpu(&[0, 0xB2, 0, 4, 0, 0x40, 0, 0]));
        assert!(!parse_lbpu(&[0, 0xB0, 0, 4, 0, 0x80, 0, 0]));
        let mut b0 = [0u8; 64];
        b0[1] = 0xB0;
        b0[20..24].copy_from_slice(&1000u32.to_be_bytes());
        b0[24..28].copy_from_slice(&16u32.to_be_bytes());
        assert_eq!(parse_unmap_limits(&b0), Some((1000, 16)));
        assert_eq!(parse_unmap_limits(&b0[..24]), None);
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
