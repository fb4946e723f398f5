//! Identify data structures (4096 bytes each): controller, namespace,
//! active namespace list, namespace identification descriptors; plus the
//! parsing a host needs.

use crate::subsystem::{Namespace, Subsystem};
use crate::{get_str, le16, le32, le64, put16, put32, put64, put_str};

pub const LEN: usize = 4096;

pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTORS: u8 = 0x03;
    pub const CS_NAMESPACE: u8 = 0x05;
    pub const CS_CONTROLLER: u8 = 0x06;
}

/// Controller types (CNTRLTYPE).
pub const CNTRLTYPE_IO: u8 = 1;
pub const CNTRLTYPE_DISCOVERY: u8 = 2;

/// ONCS bits.
pub const ONCS_COMPARE: u16 = 1 << 0;
pub const ONCS_DSM: u16 = 1 << 2;
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;

/// Version 1.3: namespace descriptors (CNS 3) are used, the 2.0-only
/// command-set-independent identify is not.
pub const VERSION: u32 = 0x0001_0300;

/// What goes into Identify Controller.
#[derive(Debug, Clone)]
pub struct CtrlParams {
    pub cntlid: u16,
    pub cntrltype: u8,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    pub subnqn: String,
    pub nn: u32,
    pub vwc: bool,
    /// Max transfer as a power of two of 4 KiB pages.
    pub mdts: u8,
    pub maxcmd: u16,
    /// In-capsule command size in 16-byte units (64-byte SQE included).
    pub ioccsz: u32,
    pub iorcsz: u32,
    /// Keep-alive granularity in 100 ms units.
    pub kas: u16,
    /// Async event request limit, zero-based.
    pub aerl: u8,
    pub oncs: u16,
}

pub fn controller(p: &CtrlParams) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    put_str(&mut b[4..24], &p.serial, b' ');
    put_str(&mut b[24..64], &p.model, b' ');
    put_str(&mut b[64..72], &p.firmware, b' ');
    b[72] = 6; // RAB: recommended arbitration burst
    // CMIC: several ports (gateways), several controllers, ANA reporting.
    b[76] = 1 << 0 | 1 << 1 | if p.cntrltype == CNTRLTYPE_IO { crate::ana::CMIC_ANA } else { 0 };
    b[77] = p.mdts;
    put16(&mut b, 78, p.cntlid);
    put32(&mut b, 80, VERSION);
    if p.cntrltype == CNTRLTYPE_IO {
        // OAES: namespace attribute and ANA change notices.
        put32(&mut b, 92, 1 << 8 | crate::ana::OAES_ANA_CHANGE);
        // Bytes 342..352 (base spec 2.0, Figure 312). One byte off, Linux
        // reads a huge ANAGRPMAX, finds the ANA log larger than MDTS and
        // silently disables ANA (multipath then ignores the states).
        b[342] = crate::ana::TRANSITION_TIME_S; // ANATT
        b[343] = crate::ana::ANACAP;
        put32(&mut b, 344, crate::ana::MAX_GROUPS); // ANAGRPMAX
        put32(&mut b, 348, crate::ana::MAX_GROUPS); // NANAGRPID
    }
    b[111] = p.cntrltype;
    b[258] = 3; // ACL, zero-based
    b[259] = p.aerl;
    b[260] = 0x03; // FRMW: one slot, slot 1 read-only
    b[261] = 0x06; // LPA: commands supported and effects log, extended data
    b[262] = 0; // ELPE: one error log entry (zero-based)
    put16(&mut b, 320, p.kas);
    b[512] = 0x66; // SQES: 64 bytes
    b[513] = 0x44; // CQES: 16 bytes
    put16(&mut b, 514, p.maxcmd);
    put32(&mut b, 516, p.nn);
    put16(&mut b, 520, p.oncs);
    // VWC: present, and Flush with NSID FFFFFFFFh supported.
    b[525] = if p.vwc { 0x07 } else { 0x06 };
    // SGLS: SGLs supported (byte aligned), offsets in data block
    // descriptors (in-capsule data).
    put32(&mut b, 536, (1 << 0) | (1 << 20));
    // MNAN: Linux refuses an ANA-reporting controller whose MNAN is 0 or
    // above NN ("Invalid MNAN value"), and sizes its ANA log buffer by it.
    put32(&mut b, 540, p.nn);
    put_str(&mut b[768..1023], &p.subnqn, 0);
    put32(&mut b, 1792, p.ioccsz);
    put32(&mut b, 1796, p.iorcsz);
    put16(&mut b, 1800, 0); // ICDOFF
    b[1802] = 0; // FCATT: dynamic controller model
    b[1803] = 1; // MSDBD: one SGL descriptor per command
    put16(&mut b, 1804, 1); // OFCS: Disconnect supported
    put16(&mut b, 2048, 0x09C4); // PSD0: max power 25 W (0.01 W units)
    b
}

/// The fields of Identify Controller a host acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdCtrl {
    pub cntlid: u16,
    pub mdts: u8,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub vwc: u8,
    pub sgls: u32,
    pub kas: u16,
    pub ioccsz: u32,
    pub iorcsz: u32,
    pub icdoff: u16,
    pub cntrltype: u8,
    pub serial: String,
    pub model: String,
    pub subnqn: String,
}

impl IdCtrl {
    pub fn parse(b: &[u8]) -> Option<IdCtrl> {
        if b.len() < LEN {
            return None;
        }
        Some(IdCtrl {
            cntlid: le16(b, 78),
            mdts: b[77],
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            oncs: le16(b, 520),
            vwc: b[525],
            sgls: le32(b, 536),
            kas: le16(b, 320),
            ioccsz: le32(b, 1792),
            iorcsz: le32(b, 1796),
            icdoff: le16(b, 1800),
            cntrltype: b[111],
            serial: get_str(&b[4..24]),
            model: get_str(&b[24..64]),
            subnqn: get_str(&b[768..1024]),
        })
    }
}

pub fn namespace(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let blocks = ns.blocks();
    put64(&mut b, 0, blocks); // NSZE
    put64(&mut b, 8, blocks); // NCAP
    put64(&mut b, 16, blocks); // NUSE
    b[24] = if ns.volume.info().supports_discard { 1 } else { 0 }; // NSFEAT: thin provisioning
    b[25] = 0; // NLBAF: one format (zero-based)
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: may be shared by several controllers
    // DLFEAT: deallocated blocks read as zeroes; Write Zeroes may deallocate.
    b[33] = 0x01 | 0x08;
    put32(&mut b, 92, ns.ana_group); // ANAGRPID
    b[99] = ns.read_only() as u8; // NSATTR: write protected
    b[104..120].copy_from_slice(&ns.uuid); // NGUID
    b[130] = crate::LBA_SHIFT as u8; // LBAF0: LBADS
    b
}

/// (size in blocks, block size in bytes, read-only) from Identify Namespace.
pub fn parse_namespace(b: &[u8]) -> Option<(u64, u32, bool)> {
    if b.len() < LEN {
        return None;
    }
    let fmt = (b[26] & 0x0F) as usize;
    let lbads = b[128 + fmt * 4 + 2];
    if !(9..=16).contains(&lbads) {
        return None;
    }
    Some((le64(b, 0), 1u32 << lbads, b[99] & 1 != 0))
}

/// Active NSIDs greater than `after`, ascending, up to 1024.
pub fn active_ns_list(s: &Subsystem, after: u32) -> Vec<u8> {
    let mut ids: Vec<u32> = s.namespaces.iter().map(|n| n.nsid).filter(|&n| n > after).collect();
    ids.sort_unstable();
    let mut b = vec![0u8; LEN];
    for (i, id) in ids.iter().take(LEN / 4).enumerate() {
        put32(&mut b, i * 4, *id);
    }
    b
}

/// Namespace identification descriptors: NGUID, UUID and command set (NVM).
pub fn ns_descriptors(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let mut o = 0;
    for (nidt, id) in [(2u8, &ns.uuid[..]), (3u8, &ns.uuid[..]), (4u8, &[0u8][..])] {
        b[o] = nidt;
        b[o + 1] = id.len() as u8;
        b[o + 4..o + 4 + id.len()].copy_from_slice(id);
        o += 4 + id.len();
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_block::{BackendSpec, Volume};

    fn ns() -> Namespace {
        Namespace::new("nqn.x:y", 1, Volume::open("v", &BackendSpec::ram(1 << 20)).unwrap(), false)
    }

    #[test]
    fn controller_fields_linux_checks() {
        let p = CtrlParams {
            cntlid: 5,
            cntrltype: CNTRLTYPE_IO,
            serial: "SN1".into(),
            model: "blockwire".into(),
            firmware: "0.1".into(),
            subnqn: "nqn.2026-11.org.blockwire:t".into(),
            nn: 2,
            vwc: true,
            mdts: 8,
            maxcmd: 128,
            ioccsz: 260,
            iorcsz: 1,
            kas: 10,
            aerl: 3,
            oncs: ONCS_COMPARE | ONCS_DSM | ONCS_WRITE_ZEROES,
        };
        let b = controller(&p);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[78..80], &[5, 0]);
        assert_eq!(&b[320..322], &[10, 0]);
        assert_eq!(&b[1792..1800], &[4, 1, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[1800..1802], &[0, 0]);
        assert_eq!(&b[536..540], &[1, 0, 0x10, 0]);
        assert_eq!(&b[520..522], &[0x0D, 0]);
        assert_eq!(&b[4..8], b"SN1 ");
        assert_eq!(b[111], 1);
        assert_eq!(b[76] & crate::ana::CMIC_ANA, crate::ana::CMIC_ANA);
        assert_eq!((b[342], b[343]), (crate::ana::TRANSITION_TIME_S, crate::ana::ANACAP));
        assert_eq!((le32(&b, 344), le32(&b, 348)), (128, 128));
        assert_eq!(&b[352..356], &[0; 4], "PELS follows NANAGRPID");
        // MNAN in 1..=NN, or Linux refuses the controller.
        assert_eq!(le32(&b, 540), 2);
        assert_eq!(le32(&b, 92) & crate::ana::OAES_ANA_CHANGE, crate::ana::OAES_ANA_CHANGE);
        let id = IdCtrl::parse(&b).unwrap();
        assert_eq!((id.cntlid, id.mdts, id.nn, id.ioccsz, id.iorcsz, id.kas), (5, 8, 2, 260, 1, 10));
        assert_eq!(id.subnqn, "nqn.2026-11.org.blockwire:t");
        assert_eq!(id.serial, "SN1");
    }

    #[test]
    fn namespace_and_lists() {
        let n = ns();
        let b = namespace(&n);
        assert_eq!(&b[0..8], &2048u64.to_le_bytes());
        assert_eq!(b[130], 9);
        assert_eq!(le32(&b, 92), 1); // ANAGRPID
        assert_eq!(parse_namespace(&b), Some((2048, 512, false)));
        let d = ns_descriptors(&n);
        assert_eq!(&d[0..4], &[2, 16, 0, 0]);
        assert_eq!(&d[20..24], &[3, 16, 0, 0]);
        assert_eq!(&d[40..45], &[4, 1, 0, 0, 0]);
        assert_eq!(&d[4..20], &n.uuid);
        let s = Subsystem { nqn: "nqn.x:y".into(), serial: "s".into(), model: "m".into(), namespaces: vec![n.clone(), Namespace::new("nqn.x:y", 7, n.volume.clone(), false)], allowed_hosts: vec![], ana: Default::default() };
        let l = active_ns_list(&s, 0);
        assert_eq!(&l[..12], &[1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        let l = active_ns_list(&s, 1);
        assert_eq!(&l[..8], &[7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
