//! SBC commands that move or check blocks: READ/WRITE (6/10/12/16), WRITE
//! AND VERIFY, VERIFY, WRITE SAME, UNMAP, COMPARE AND WRITE, PRE-FETCH,
//! SYNCHRONIZE CACHE and READ CAPACITY.

use crate::cdb::field::{self, *};
use crate::cdb::op;
use crate::limits::{MAX_COMPARE_AND_WRITE_BLOCKS, MAX_TRANSFER_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS};
use crate::sense::{key, Sense};
use crate::Lun;
use bw_block::{BlockError, Durability, Request};
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;

pub const BLOCK: usize = 512;
const BLOCK_U64: u64 = 512;

/// Map a backend error to sense data: EIO-like failures are medium errors,
/// a full backing store is SPACE ALLOCATION FAILED, a backend that did not
/// answer in time (rbd with the cluster away) is ABORTED COMMAND / LOGICAL
/// UNIT COMMUNICATION TIME-OUT (the initiator may retry), anything else is
/// a hardware (target) failure.
pub fn io_sense(e: &BlockError, write: bool) -> Sense {
    match e {
        BlockError::OutOfRange { .. } => Sense::LBA_OUT_OF_RANGE,
        BlockError::ReadOnly => Sense::WRITE_PROTECTED,
        BlockError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => Sense::new(key::ABORTED_COMMAND, 0x08, 0x01),
        BlockError::Io(io) => match io.raw_os_error() {
            // Linux errno values: ENOSPC 28, EIO 5, ENODATA 61.
            Some(28) => Sense::new(key::DATA_PROTECT, 0x27, 0x07), // SPACE ALLOCATION FAILED WRITE PROTECT
            Some(5) | Some(61) | None if write => Sense::WRITE_ERROR,
            Some(5) | Some(61) | None => Sense::UNRECOVERED_READ_ERROR,
            Some(_) => Sense::INTERNAL_TARGET_FAILURE,
        },
    }
}

/// (LBA, number of blocks) of a READ/WRITE/VERIFY-style CDB.
#[inline]
pub fn lba_and_len(cdb: &[u8]) -> (u64, u64) {
    match GROUP_CODE.get(cdb) {
        0 => {
            // 6-byte: transfer length 0 means 256 blocks.
            let lba = (LBA_6.get(cdb) & LBA_6_MASK) as u64;
            let n = match BLOCKS_6.get(cdb) {
                0 => 256,
                n => n as u64,
            };
            (lba, n)
        }
        1 | 2 => (LBA_10.get(cdb) as u64, BLOCKS_10.get(cdb) as u64),
        5 => (LBA_12.get(cdb) as u64, BLOCKS_12.get(cdb) as u64),
        _ => (LBA_16.get(cdb), BLOCKS_16.get(cdb) as u64),
    }
}

/// INVALID FIELD IN CDB at the transfer length of a READ/WRITE/VERIFY-
/// style CDB, wherever its group puts it.
fn transfer_length_invalid(cdb: &[u8]) -> Sense {
    match GROUP_CODE.get(cdb) {
        0 => Sense::invalid_in_cdb(BLOCKS_6),
        1 | 2 => Sense::invalid_in_cdb(BLOCKS_10),
        5 => Sense::invalid_in_cdb(BLOCKS_12),
        _ => Sense::invalid_in_cdb(BLOCKS_16),
    }
}

/// FUA of a WRITE-style CDB (the 6-byte WRITE has none).
fn fua(cdb: &[u8]) -> bool {
    OPERATION_CODE.get(cdb) != op::WRITE_6 && FUA.get(cdb)
}

impl Lun {
    #[inline]
    fn check_range(&self, lba: u64, n: u64) -> Result<(), Sense> {
        match lba.checked_add(n) {
            Some(end) if end <= self.blocks() => Ok(()),
            _ => Err(Sense::LBA_OUT_OF_RANGE),
        }
    }

    #[inline]
    fn check_writable(&self) -> Result<(), Sense> {
        if self.write_protected() {
            Err(Sense::WRITE_PROTECTED)
        } else {
            Ok(())
        }
    }

    /// Flush if the initiator asked for FUA or turned the write cache off;
    /// backends that are already write-through or volatile need nothing.
    fn flush_after_write(&self, fua: bool) -> Result<(), Sense> {
        if (fua || !self.wce.load(Relaxed)) && self.volume.info().durability == Durability::WriteBack {
            self.volume.flush().map_err(|e| io_sense(&e, true))?;
        }
        Ok(())
    }

    /// Checks of READ (6/10/12/16); the byte offset and length it reads.
    pub(crate) fn read_range(&self, cdb: &[u8]) -> Result<(u64, usize), Sense> {
        let six = OPERATION_CODE.get(cdb) == op::READ_6;
        if !six && PROTECT.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(PROTECT)); // RDPROTECT: no protection information
        }
        let (lba, n) = lba_and_len(cdb);
        self.check_range(lba, n)?;
        if n > MAX_TRANSFER_BLOCKS as u64 {
            return Err(transfer_length_invalid(cdb));
        }
        Ok((lba * BLOCK_U64, n as usize * BLOCK))
    }

    /// READ as a request to submit to the volume (its checks passed);
    /// `None` if nothing is to be read.
    pub(crate) fn read_request(&self, cdb: &[u8]) -> Result<Option<Request>, Sense> {
        let (offset, len) = self.read_range(cdb)?;
        Ok((len > 0).then(|| Request::read(offset, len)))
    }

    /// A plain WRITE (6/10/12/16) as a request to submit to the volume,
    /// with [`Lun::write_pieces`]'s checks and the same whole blocks of
    /// the data received. `None` when the write needs more than one
    /// request (a flush after it: FUA or the write cache off on a
    /// write-back volume) or has nothing to write.
    pub(crate) fn write_request(&self, cdb: &[u8], data: &[Bytes]) -> Result<Option<Request>, Sense> {
        let (lba, n) = self.write_checks(cdb)?;
        if (fua(cdb) || !self.wce.load(Relaxed)) && self.volume.info().durability == Durability::WriteBack {
            return Ok(None);
        }
        let want = n as usize * BLOCK;
        let total: usize = data.iter().map(|p| p.len()).sum();
        let mut left = want.min(total / BLOCK * BLOCK);
        if left == 0 {
            return Ok(None);
        }
        let mut pieces = Vec::with_capacity(data.len());
        for p in data {
            let k = p.len().min(left);
            if k > 0 {
                pieces.push(p.slice(..k));
            }
            left -= k;
        }
        Ok(Some(Request::Write { offset: lba * BLOCK_U64, data: pieces }))
    }

    /// The checks of WRITE (6/10/12/16) and WRITE AND VERIFY; the LBA and
    /// number of blocks.
    fn write_checks(&self, cdb: &[u8]) -> Result<(u64, u64), Sense> {
        let six = OPERATION_CODE.get(cdb) == op::WRITE_6;
        if !six && PROTECT.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(PROTECT)); // WRPROTECT
        }
        let (lba, n) = lba_and_len(cdb);
        self.check_range(lba, n)?;
        if n > MAX_TRANSFER_BLOCKS as u64 {
            return Err(transfer_length_invalid(cdb));
        }
        self.check_writable()?;
        Ok((lba, n))
    }

    /// READ (6/10/12/16) into `out`, the general path (commands the plan
    /// does not hand to the transport, see [`crate::Plan::read`]). The
    /// data has to be initialized before `read_at` may write it: bytes
    /// already in `out` are overwritten in place, growth within its
    /// capacity is zero-filled, and a buffer too small is replaced by a
    /// zeroed allocation (calloc: no separate fill).
    pub fn read(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
        let (offset, len) = self.read_range(cdb)?;
        if out.len() >= len {
            out.truncate(len);
        } else if out.capacity() >= len {
            out.resize(len, 0);
        } else {
            *out = vec![0; len];
        }
        if len > 0 {
            self.volume.read_at(out, offset).map_err(|e| {
                out.clear();
                io_sense(&e, false)
            })?;
        }
        Ok(())
    }

    /// WRITE (6/10/12/16) and WRITE AND VERIFY (10/12/16) with the data in
    /// consecutive pieces (as a transport received it), each written where
    /// it lands: no copy into one buffer. Writes the whole blocks the
    /// initiator actually sent (an iSCSI overflow may send fewer), ignores
    /// excess data.
    pub fn write_pieces<P: AsRef<[u8]>>(&self, cdb: &[u8], pieces: &[P], verify: bool) -> Result<(), Sense> {
        let (lba, n) = self.write_checks(cdb)?;
        let want = n as usize * BLOCK;
        let total: usize = pieces.iter().map(|p| p.as_ref().len()).sum();
        let have = want.min(total / BLOCK * BLOCK);
        if have == 0 {
            return Ok(());
        }
        let (mut at, mut left) = (lba * BLOCK_U64, have);
        for p in pieces {
            let p = p.as_ref();
            let k = p.len().min(left);
            if k > 0 {
                self.volume.write_at(&p[..k], at).map_err(|e| io_sense(&e, true))?;
            }
            at += k as u64;
            left -= k;
        }
        self.flush_after_write(fua(cdb) || verify)?;
        // WRITE AND VERIFY's BYTCHK 01b and 11b: compare.
        if verify && BYTCHK.get(cdb) & 0b01 != 0 {
            // BYTCHK: read the medium back and compare.
            let data: std::borrow::Cow<[u8]> = match pieces {
                [one] => (&one.as_ref()[..have]).into(),
                _ => {
                    let mut joined = Vec::with_capacity(total);
                    pieces.iter().for_each(|p| joined.extend_from_slice(p.as_ref()));
                    joined.truncate(have);
                    joined.into()
                }
            };
            self.compare_medium(lba, &data)?;
        }
        Ok(())
    }

    /// Compare `expected` with the medium from `lba`, in bounded chunks.
    /// Returns MISCOMPARE with the offset of the first differing byte.
    fn compare_medium(&self, lba: u64, expected: &[u8]) -> Result<(), Sense> {
        const CHUNK: usize = 1 << 20;
        let mut buf = vec![0u8; expected.len().min(CHUNK)];
        for (i, want) in expected.chunks(CHUNK).enumerate() {
            let got = &mut buf[..want.len()];
            let at = lba * BLOCK_U64 + (i * CHUNK) as u64;
            self.volume.read_at(got, at).map_err(|e| io_sense(&e, false))?;
            if let Some(pos) = got.iter().zip(want).position(|(a, b)| a != b) {
                return Err(Sense::MISCOMPARE_DURING_VERIFY.with_information((i * CHUNK + pos) as u32));
            }
        }
        Ok(())
    }

    /// VERIFY (10/12/16): BYTCHK 0 reads the range, 01b compares the data
    /// sent, 11b compares one sent block against every block.
    pub fn verify(&self, cdb: &[u8], data: &[u8]) -> Result<(), Sense> {
        if PROTECT.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(PROTECT)); // VRPROTECT
        }
        let bytchk = BYTCHK.get(cdb);
        let (lba, n) = lba_and_len(cdb);
        self.check_range(lba, n)?;
        if bytchk == 0b10 {
            return Err(Sense::invalid_in_cdb(BYTCHK));
        }
        if n > MAX_TRANSFER_BLOCKS as u64 {
            return Err(transfer_length_invalid(cdb));
        }
        let len = n as usize * BLOCK;
        match bytchk {
            0 => {
                // Medium verification: every block must be readable.
                let mut buf = vec![0u8; len.min(1 << 20)];
                let mut done = 0;
                while done < len {
                    let k = (len - done).min(buf.len());
                    self.volume
                        .read_at(&mut buf[..k], lba * BLOCK_U64 + done as u64)
                        .map_err(|e| io_sense(&e, false))?;
                    done += k;
                }
                Ok(())
            }
            1 => {
                let have = len.min(data.len() / BLOCK * BLOCK);
                self.compare_medium(lba, &data[..have])
            }
            _ => {
                if data.len() < BLOCK {
                    return Err(Sense::invalid_in_cdb(BYTCHK));
                }
                let block = &data[..BLOCK];
                let mut buf = vec![0u8; BLOCK];
                for i in 0..n {
                    self.volume.read_at(&mut buf, (lba + i) * BLOCK_U64).map_err(|e| io_sense(&e, false))?;
                    if let Some(pos) = buf.iter().zip(block).position(|(a, b)| a != b) {
                        return Err(Sense::MISCOMPARE_DURING_VERIFY.with_information(pos as u32));
                    }
                }
                Ok(())
            }
        }
    }

    /// WRITE SAME (10/16): UNMAP with a zero block (or NDOB) deallocates,
    /// otherwise the block is replicated over the range.
    pub fn write_same(&self, cdb: &[u8], data: &[u8]) -> Result<(), Sense> {
        let sixteen = OPERATION_CODE.get(cdb) == op::WRITE_SAME_16;
        if PROTECT.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(PROTECT)); // WRPROTECT
        }
        if WRITE_SAME_ANCHOR.get(cdb) {
            return Err(Sense::invalid_in_cdb(WRITE_SAME_ANCHOR)); // unsupported
        }
        if WRITE_SAME_PB_LB_DATA.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(WRITE_SAME_PB_LB_DATA));
        }
        let ndob = sixteen && WRITE_SAME_NDOB.get(cdb);
        let unmap = WRITE_SAME_UNMAP.get(cdb);
        let (lba, n) = lba_and_len(cdb);
        let length_invalid = || transfer_length_invalid(cdb);
        if n == 0 {
            return Err(length_invalid()); // WSNZ
        }
        if n > MAX_WRITE_SAME_BLOCKS {
            return Err(length_invalid());
        }
        self.check_range(lba, n)?;
        self.check_writable()?;
        // No data at all with UNMAP set (an initiator sending no data-out)
        // is taken as a zero block; a partial block is an error.
        let no_data = ndob || (unmap && data.is_empty());
        if !no_data && data.len() != BLOCK {
            return Err(length_invalid());
        }
        let zero = no_data || data.iter().all(|b| *b == 0);
        let (off, len) = (lba * BLOCK_U64, n * BLOCK_U64);
        let r = if zero && unmap && self.discard {
            self.volume.discard(off, len)
        } else if zero {
            self.volume.write_zeroes(off, len)
        } else {
            self.replicate(&data[..BLOCK], off, len)
        };
        r.map_err(|e| io_sense(&e, true))?;
        self.flush_after_write(false)
    }

    fn replicate(&self, block: &[u8], off: u64, len: u64) -> bw_block::Result<()> {
        const CHUNK_BLOCKS: usize = 2048;
        let blocks = (len / BLOCK_U64) as usize;
        let chunk: Vec<u8> = block.iter().copied().cycle().take(blocks.min(CHUNK_BLOCKS) * BLOCK).collect();
        let mut done = 0u64;
        while done < len {
            let k = (len - done).min(chunk.len() as u64) as usize;
            self.volume.write_at(&chunk[..k], off + done)?;
            done += k as u64;
        }
        Ok(())
    }

    /// UNMAP: validate every block descriptor, then punch each range.
    pub fn unmap(&self, cdb: &[u8], params: &[u8]) -> Result<(), Sense> {
        if UNMAP_ANCHOR.get(cdb) {
            return Err(Sense::invalid_in_cdb(UNMAP_ANCHOR));
        }
        if !self.discard {
            return Err(Sense::INVALID_OPCODE);
        }
        let list_len = UNMAP_PARAMETER_LIST_LENGTH.get(cdb) as usize;
        if list_len == 0 {
            return Ok(());
        }
        if list_len < UNMAP_HEADER_LEN {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR);
        }
        self.check_writable()?;
        let p = &params[..list_len.min(params.len())];
        if p.len() < UNMAP_HEADER_LEN {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR);
        }
        let bd_len = UNMAP_BLOCK_DESCRIPTOR_DATA_LENGTH.get(p) as usize;
        if bd_len > p.len() - UNMAP_HEADER_LEN {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR);
        }
        let whole = bd_len / UNMAP_DESCRIPTOR_LEN * UNMAP_DESCRIPTOR_LEN;
        let descriptors = &p[UNMAP_HEADER_LEN..UNMAP_HEADER_LEN + whole];
        if descriptors.len() / UNMAP_DESCRIPTOR_LEN > MAX_UNMAP_DESCRIPTORS as usize {
            return Err(Sense::invalid_param_field(UNMAP_BLOCK_DESCRIPTOR_DATA_LENGTH.offset() as u16, None));
        }
        let range = |d: &[u8]| (UNMAP_DESCRIPTOR_LBA.get(d), UNMAP_DESCRIPTOR_BLOCKS.get(d) as u64);
        for d in descriptors.chunks_exact(UNMAP_DESCRIPTOR_LEN) {
            let (lba, n) = range(d);
            self.check_range(lba, n)?;
        }
        for d in descriptors.chunks_exact(UNMAP_DESCRIPTOR_LEN) {
            let (lba, n) = range(d);
            if n > 0 {
                self.volume.discard(lba * BLOCK_U64, n * BLOCK_U64).map_err(|e| io_sense(&e, true))?;
            }
        }
        Ok(())
    }

    /// COMPARE AND WRITE: atomic with respect to other COMPARE AND WRITEs on
    /// this LUN (the VMware ATS use case), not to plain writes.
    pub fn compare_and_write(&self, cdb: &[u8], data: &[u8]) -> Result<(), Sense> {
        if PROTECT.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(PROTECT));
        }
        let lba = LBA_16.get(cdb);
        let n = COMPARE_AND_WRITE_BLOCKS.get(cdb) as u64;
        let blocks_invalid = || Sense::invalid_in_cdb(COMPARE_AND_WRITE_BLOCKS);
        if n == 0 {
            // No blocks is no error, but data sent with it does not fit the CDB.
            return if data.is_empty() { Ok(()) } else { Err(blocks_invalid()) };
        }
        if n > MAX_COMPARE_AND_WRITE_BLOCKS as u64 {
            return Err(blocks_invalid());
        }
        self.check_range(lba, n)?;
        self.check_writable()?;
        let len = n as usize * BLOCK;
        if data.len() != 2 * len {
            return Err(blocks_invalid());
        }
        let (verify, write) = data.split_at(len);
        let _guard = self.caw_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.compare_medium(lba, verify)?;
        self.volume.write_at(write, lba * BLOCK_U64).map_err(|e| io_sense(&e, true))?;
        self.flush_after_write(FUA.get(cdb))
    }

    /// PRE-FETCH (10/16): range check only; the page cache does the rest.
    pub fn pre_fetch(&self, cdb: &[u8]) -> Result<(), Sense> {
        let (lba, n) = lba_and_len(cdb);
        self.check_range(lba, n)
    }

    /// SYNCHRONIZE CACHE (10/16): a real flush of the backend.
    pub fn synchronize_cache(&self, cdb: &[u8]) -> Result<(), Sense> {
        let (lba, n) = lba_and_len(cdb);
        self.check_range(lba, n)?;
        self.volume.flush().map_err(|e| io_sense(&e, true))
    }

    /// READ CAPACITY (10).
    pub fn read_capacity_10(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
        if !READ_CAPACITY_10_PMI.get(cdb) && LBA_10.get(cdb) != 0 {
            return Err(Sense::invalid_in_cdb(LBA_10)); // LBA without PMI
        }
        let last = self.blocks().saturating_sub(1);
        out.extend_from_slice(&u32::try_from(last).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&(BLOCK as u32).to_be_bytes());
        Ok(())
    }

    /// READ CAPACITY (16); LBPME/LBPRZ when the backend can deallocate.
    pub fn read_capacity_16(&self, _cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
        out.resize(32, 0);
        field::RC16_LAST_LBA.set(out, self.blocks().saturating_sub(1));
        field::RC16_BLOCK_LENGTH.set(out, BLOCK as u32);
        // LBPPBE 3: 4 KiB physical blocks, matching the optimal granularity.
        out[13] = 0x03;
        if self.discard {
            out[14] = 0x80 | 0x40; // LBPME, LBPRZ
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_map_to_sense() {
        let io = |e: std::io::Error| BlockError::Io(e);
        // A timed-out backend (kind kept, errno lost by a wrapping message).
        let timeout = io(std::io::Error::new(std::io::ErrorKind::TimedOut, "rbd: write at offset 0: timed out"));
        assert_eq!(io_sense(&timeout, true), Sense::new(key::ABORTED_COMMAND, 0x08, 0x01));
        assert_eq!(io_sense(&io(std::io::Error::from_raw_os_error(110)), false), Sense::new(key::ABORTED_COMMAND, 0x08, 0x01));
        assert_eq!(io_sense(&io(std::io::Error::from_raw_os_error(5)), true), Sense::WRITE_ERROR);
        assert_eq!(io_sense(&io(std::io::Error::from_raw_os_error(5)), false), Sense::UNRECOVERED_READ_ERROR);
        assert_eq!(io_sense(&io(std::io::Error::from_raw_os_error(28)), true), Sense::new(key::DATA_PROTECT, 0x27, 0x07));
    }
}
