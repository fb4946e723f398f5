//! GET LBA STATUS (SBC-4 5.8, SERVICE ACTION IN(16) / 0x12): which blocks
//! are mapped and which are deallocated, from the volume's real allocation
//! state (SEEK_DATA/SEEK_HOLE on files, memfd pages of RAM volumes), so
//! thin-provisioning tools and qemu can skip holes.

use crate::block_io::io_sense;
use crate::cdb::field::*;
use crate::sense::Sense;
use crate::Lun;

const BLOCK: u64 = bw_block::SECTOR_SIZE as u64;
/// Descriptors per answer: enough for a useful map, bounded work per command.
const MAX_DESCRIPTORS: usize = 64;

/// Provisioning status codes of an LBA status descriptor.
const MAPPED: u8 = 0x0;
const DEALLOCATED: u8 = 0x1;

impl Lun {
    pub(crate) fn get_lba_status(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
        let start = LBA_16.get(cdb);
        let alloc = SAI_ALLOCATION_LENGTH.get(cdb) as usize;
        // REPORT TYPE (SBC-4 r20): 0 all, 1 non-zero status, 2 mapped,
        // 3 deallocated, 4 anchored (we never anchor).
        let report = GET_LBA_STATUS_REPORT_TYPE.get(cdb);
        if report > 4 {
            return Err(Sense::invalid_in_cdb(GET_LBA_STATUS_REPORT_TYPE));
        }
        let blocks = self.blocks();
        if start >= blocks {
            return Err(Sense::LBA_OUT_OF_RANGE);
        }
        out.extend_from_slice(&[0; 8]);
        let room = alloc.saturating_sub(8).div_ceil(16).min(MAX_DESCRIPTORS);
        let mut lba = start;
        let mut n = 0;
        while lba < blocks && n < room {
            let want = (blocks - lba).min(u32::MAX as u64) * BLOCK;
            let e = self.volume.allocation(lba * BLOCK, want).map_err(|e| io_sense(&e, false))?;
            let count = e.len.div_ceil(BLOCK).min(blocks - lba);
            let status = if e.allocated { MAPPED } else { DEALLOCATED };
            let wanted = match report {
                0 => true,
                1 | 3 => status == DEALLOCATED,
                2 => status == MAPPED,
                _ => false,
            };
            if wanted {
                out.extend_from_slice(&lba.to_be_bytes());
                out.extend_from_slice(&(count as u32).to_be_bytes());
                out.extend_from_slice(&[status, 0, 0, 0]);
                n += 1;
            }
            lba += count;
        }
        // PARAMETER DATA LENGTH counts the bytes after itself.
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        Ok(())
    }
}
