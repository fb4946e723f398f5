//! The 64-byte submission queue entry (SQE) and 16-byte completion queue
//! entry (CQE), as views with named accessors.

use crate::Status;

/// Admin opcodes.
pub mod admin {
    pub const DELETE_SQ: u8 = 0x00;
    pub const CREATE_SQ: u8 = 0x01;
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const DELETE_CQ: u8 = 0x04;
    pub const CREATE_CQ: u8 = 0x05;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set opcodes.
pub mod nvm {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const COMPARE: u8 = 0x05;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DSM: u8 = 0x09;
    pub const RESV_REGISTER: u8 = 0x0D;
    pub const RESV_REPORT: u8 = 0x0E;
    pub const RESV_ACQUIRE: u8 = 0x11;
    pub const RESV_RELEASE: u8 = 0x15;
    /// Dataset Management CDW11 attribute: deallocate the ranges (AD).
    pub const DSM_DEALLOCATE: u32 = 1 << 2;
    /// Most ranges one Dataset Management command carries (NR is 0's based, 8 bits).
    pub const DSM_MAX_RANGES: usize = 256;
    /// Read/Write CDW12 bit 30: Force Unit Access (the data is durable
    /// before the command completes).
    pub const RW_FUA: u32 = 1 << 30;
}

/// The fabrics command opcode; the command type is in byte 4 (fctype).
pub const FABRICS_OPCODE: u8 = 0x7F;

/// SGL descriptor types as the TCP and RDMA transports use them
/// (type << 4 | subtype).
pub mod sgl {
    /// Keyed data block, address subtype: the host's memory, reached by
    /// RDMA READ/WRITE with the descriptor's key (NVMe/RDMA).
    pub const KEYED: u8 = 0x40;
    /// Keyed data block, invalidate-key subtype: as [`KEYED`], and the
    /// host asks for its key to be invalidated with the response.
    pub const KEYED_INVALIDATE: u8 = 0x4F;
    /// Data block, offset subtype: data is in the capsule (offset in `addr`).
    pub const INCAPSULE: u8 = 0x01;
    /// Transport data block, transport-specific subtype A: data moves in
    /// H2CData/C2HData PDUs.
    pub const TRANSPORT: u8 = 0x5A;
}

/// PSDT = 01 (SGL for data, metadata contiguous) in the SQE flags byte.
pub const FLAGS_PSDT_SGL: u8 = 0x40;

/// One SGL data descriptor (bytes 24..40 of the SQE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    pub addr: u64,
    pub length: u32,
    pub kind: u8,
}

/// A keyed SGL data block descriptor: `length` bytes of the host's memory
/// at `addr`, reached with `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyed {
    pub addr: u64,
    pub length: u32,
    pub key: u32,
    /// The invalidate-key subtype.
    pub invalidate: bool,
}

/// Submission queue entry fields (NVMe Base 4.2), each defined once.
pub mod sqe {
    use bw_wire::{Field, Le};

    pub const OPCODE: Field<u8> = Field::at(0);
    pub const FLAGS: Field<u8> = Field::at(1);
    pub const CID: Field<Le<u16>> = Field::at(2);
    pub const NSID: Field<Le<u32>> = Field::at(4);
    /// Fabrics commands: the command type, where NSID is for others.
    pub const FCTYPE: Field<u8> = Field::at(4);
    /// The SGL data descriptor (bytes 24..40): address, length, the three
    /// reserved bytes, and the descriptor type.
    pub const SGL_ADDR: Field<Le<u64>> = Field::at(24);
    pub const SGL_LENGTH: Field<Le<u32>> = Field::at(32);
    pub const SGL_RESERVED: Field<[u8; 3]> = Field::at(36);
    pub const SGL_TYPE: Field<u8> = Field::at(39);
    /// A keyed SGL data block descriptor: 3-byte length and 4-byte key
    /// where the others have a 4-byte length and reserved bytes.
    pub const SGL_KEYED_LENGTH: Field<[u8; 3]> = Field::at(32);
    pub const SGL_KEY: Field<Le<u32>> = Field::at(35);
    /// Read, Write, Compare, Write Zeroes: the starting LBA (CDW10-11).
    pub const SLBA: Field<Le<u64>> = Field::at(40);

    /// Command dword `n`.
    pub const fn cdw(n: usize) -> Field<Le<u32>> {
        Field::at(n * 4)
    }
}

/// Completion queue entry fields.
pub mod cqe {
    use bw_wire::{Field, Le};

    /// Command specific dwords 0 and 1.
    pub const RESULT: Field<Le<u64>> = Field::at(0);
    pub const SQ_HEAD: Field<Le<u16>> = Field::at(8);
    pub const SQ_ID: Field<Le<u16>> = Field::at(10);
    pub const CID: Field<Le<u16>> = Field::at(12);
    /// Status field with the phase tag in bit 0.
    pub const STATUS: Field<Le<u16>> = Field::at(14);
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; 64]);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0; 64])
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sqe(opc {:#04x} cid {} nsid {} cdw10 {:#x})", self.opcode(), self.cid(), self.nsid(), self.cdw(10))
    }
}

// The accessors a command's path calls are `#[inline]`: the targets and
// initiators call them from other crates, where without it each stayed a
// call of one to four instructions (a dozen per 4 KiB I/O, callgrind,
// docs/notes/2026-11-29-where-the-rest-goes.md).
impl Sqe {
    /// From exactly 64 bytes (callers slice the capsule header).
    pub fn from_slice(b: &[u8]) -> Sqe {
        let mut a = [0u8; 64];
        a.copy_from_slice(&b[..64]);
        Sqe(a)
    }
    /// A new command with the SGL flag set, as every fabrics host sends.
    #[inline]
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::default();
        sqe::OPCODE.set(&mut s.0, opcode);
        sqe::FLAGS.set(&mut s.0, FLAGS_PSDT_SGL);
        s.set_cid(cid);
        sqe::NSID.set(&mut s.0, nsid);
        s
    }
    /// A fabrics command of type `fctype`.
    pub fn fabrics(fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(FABRICS_OPCODE, cid, 0);
        sqe::FCTYPE.set(&mut s.0, fctype);
        s
    }
    #[inline]
    pub fn opcode(&self) -> u8 {
        sqe::OPCODE.get(&self.0)
    }
    #[inline]
    pub fn flags(&self) -> u8 {
        sqe::FLAGS.get(&self.0)
    }
    #[inline]
    pub fn cid(&self) -> u16 {
        sqe::CID.get(&self.0)
    }
    #[inline]
    pub fn set_cid(&mut self, cid: u16) {
        sqe::CID.set(&mut self.0, cid)
    }
    #[inline]
    pub fn nsid(&self) -> u32 {
        sqe::NSID.get(&self.0)
    }
    /// Fabrics command type (only meaningful when opcode is 0x7F).
    #[inline]
    pub fn fctype(&self) -> u8 {
        sqe::FCTYPE.get(&self.0)
    }
    #[inline]
    pub fn is_fabrics(&self) -> bool {
        self.opcode() == FABRICS_OPCODE
    }
    /// Command dword N (10..=15), also 2 and 3.
    #[inline]
    pub fn cdw(&self, n: usize) -> u32 {
        sqe::cdw(n).get(&self.0)
    }
    #[inline]
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        sqe::cdw(n).set(&mut self.0, v)
    }
    /// The SGL data descriptor; for a keyed one (RDMA) `length` is its
    /// 3-byte length, so every transfer length check reads it the same way.
    #[inline]
    pub fn sgl(&self) -> Sgl {
        let kind = sqe::SGL_TYPE.get(&self.0);
        let length = if kind == sgl::KEYED || kind == sgl::KEYED_INVALIDATE {
            let l = sqe::SGL_KEYED_LENGTH.get(&self.0);
            u32::from_le_bytes([l[0], l[1], l[2], 0])
        } else {
            sqe::SGL_LENGTH.get(&self.0)
        };
        Sgl { addr: sqe::SGL_ADDR.get(&self.0), length, kind }
    }
    #[inline]
    pub fn set_sgl(&mut self, s: Sgl) {
        sqe::SGL_ADDR.set(&mut self.0, s.addr);
        sqe::SGL_LENGTH.set(&mut self.0, s.length);
        sqe::SGL_RESERVED.set(&mut self.0, [0; 3]);
        sqe::SGL_TYPE.set(&mut self.0, s.kind);
    }
    /// The SGL as a keyed data block descriptor, when it is one.
    pub fn keyed_sgl(&self) -> Option<Keyed> {
        let s = self.sgl();
        if s.kind != sgl::KEYED && s.kind != sgl::KEYED_INVALIDATE {
            return None;
        }
        Some(Keyed { addr: s.addr, length: s.length, key: sqe::SGL_KEY.get(&self.0), invalidate: s.kind == sgl::KEYED_INVALIDATE })
    }
    pub fn set_keyed_sgl(&mut self, k: Keyed) {
        let l = k.length.to_le_bytes();
        sqe::SGL_ADDR.set(&mut self.0, k.addr);
        sqe::SGL_KEYED_LENGTH.set(&mut self.0, [l[0], l[1], l[2]]);
        sqe::SGL_KEY.set(&mut self.0, k.key);
        sqe::SGL_TYPE.set(&mut self.0, if k.invalidate { sgl::KEYED_INVALIDATE } else { sgl::KEYED });
    }
    /// Data flows host to controller (opcode bit 0; bit 1 is the other way).
    /// Fabrics commands carry the direction in fctype instead.
    pub fn is_host_to_ctrl(&self) -> bool {
        if self.is_fabrics() {
            self.fctype() & 1 == 1
        } else {
            self.opcode() & 1 == 1
        }
    }
    /// Starting LBA (cdw10-11) and zero-based block count (cdw12 bits 15:0)
    /// of Read/Write/Compare/Write Zeroes.
    #[inline]
    pub fn slba(&self) -> u64 {
        sqe::SLBA.get(&self.0)
    }
    #[inline]
    pub fn nlb(&self) -> u32 {
        (self.cdw(12) & 0xFFFF) + 1
    }
    #[inline]
    pub fn set_rw(&mut self, slba: u64, blocks: u32) {
        sqe::SLBA.set(&mut self.0, slba);
        self.set_cdw(12, blocks.saturating_sub(1) & 0xFFFF);
    }
    /// Force Unit Access ([`nvm::RW_FUA`]) of a Read or Write.
    #[inline]
    pub fn fua(&self) -> bool {
        self.cdw(12) & nvm::RW_FUA != 0
    }
    pub fn set_fua(&mut self, fua: bool) {
        let cdw12 = self.cdw(12) & !nvm::RW_FUA;
        self.set_cdw(12, if fua { cdw12 | nvm::RW_FUA } else { cdw12 });
    }
    /// Dataset Management of `ranges` ranges (1..=256, sent as data, see
    /// `nvm_io::dsm_ranges`), deallocating them if `deallocate`.
    pub fn set_dsm(&mut self, ranges: usize, deallocate: bool) {
        self.set_cdw(10, (ranges.clamp(1, nvm::DSM_MAX_RANGES) - 1) as u32);
        self.set_cdw(11, if deallocate { nvm::DSM_DEALLOCATE } else { 0 });
    }
}

/// A completion queue entry. `status` is without the phase bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Command specific dword 0 and dword 1 (dw1 is the upper half for
    /// 8-byte Property Get results).
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub const LEN: usize = 16;
    pub fn parse(b: &[u8]) -> Cqe {
        Cqe {
            result: cqe::RESULT.get(b),
            sq_head: cqe::SQ_HEAD.get(b),
            sq_id: cqe::SQ_ID.get(b),
            cid: cqe::CID.get(b),
            status: Status::from_wire(cqe::STATUS.get(b)),
        }
    }
    pub fn write(&self, b: &mut [u8]) {
        cqe::RESULT.set(b, self.result);
        cqe::SQ_HEAD.set(b, self.sq_head);
        cqe::SQ_ID.set(b, self.sq_id);
        cqe::CID.set(b, self.cid);
        cqe::STATUS.set(b, self.status.wire(false));
    }
    pub fn dw0(&self) -> u32 {
        self.result as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_layout_matches_spec_offsets() {
        let mut s = Sqe::new(nvm::READ, 0x1234, 1);
        s.set_rw(0x0102030405, 8);
        s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::TRANSPORT });
        let b = s.0;
        assert_eq!(&b[0..8], &[0x02, 0x40, 0x34, 0x12, 1, 0, 0, 0]);
        assert_eq!(&b[24..40], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x5A]);
        assert_eq!(&b[40..48], &[5, 4, 3, 2, 1, 0, 0, 0]);
        assert_eq!(&b[48..52], &[7, 0, 0, 0]);
        assert_eq!(s.nlb(), 8);
        assert_eq!(s.slba(), 0x0102030405);
        assert!(!s.is_host_to_ctrl());
        assert!(Sqe::new(nvm::WRITE, 0, 1).is_host_to_ctrl());
        assert!(Sqe::fabrics(0x01, 0).is_host_to_ctrl()); // Connect carries data
        assert!(!Sqe::fabrics(0x04, 0).is_host_to_ctrl()); // Property Get
    }

    #[test]
    fn keyed_sgl_layout() {
        let mut s = Sqe::new(nvm::WRITE, 1, 1);
        let k = Keyed { addr: 0x1122334455667788, length: 0x030201, key: 0xAABBCCDD, invalidate: true };
        s.set_keyed_sgl(k);
        assert_eq!(&s.0[24..40], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 1, 2, 3, 0xDD, 0xCC, 0xBB, 0xAA, 0x4F]);
        assert_eq!(s.keyed_sgl(), Some(k));
        assert_eq!(s.sgl().length, 0x030201);
        s.set_sgl(Sgl { addr: 0, length: 4096, kind: sgl::INCAPSULE });
        assert_eq!(s.keyed_sgl(), None);
    }

    #[test]
    fn cqe_round_trip_and_bytes() {
        let c = Cqe { result: 0x11223344, sq_head: 5, sq_id: 1, cid: 0xBEEF, status: Status::LBA_RANGE.dnr() };
        let mut b = [0u8; 16];
        c.write(&mut b);
        assert_eq!(b, [0x44, 0x33, 0x22, 0x11, 0, 0, 0, 0, 5, 0, 1, 0, 0xEF, 0xBE, 0x00, 0x81]);
        assert_eq!(Cqe::parse(&b), c);
    }
}
