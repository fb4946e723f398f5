//! Identify data structures (4096 bytes each): controller, namespace,
//! active namespace list, namespace identification descriptors; plus the
//! parsing a host needs.

use crate::subsystem::{Namespace, Subsystem};
use crate::{get_str, put_str};
use bw_wire::{Field, Le};

pub const LEN: usize = 4096;

/// Identify Controller fields (NVMe Base 2.0, Figure 275), each defined
/// once: [`controller`] writes them and [`IdCtrl::parse`] reads them.
pub mod ctrl {
    use bw_wire::{Field, Le};

    pub const RAB: Field<u8> = Field::at(72);
    pub const CMIC: Field<u8> = Field::at(76);
    pub const MDTS: Field<u8> = Field::at(77);
    pub const CNTLID: Field<Le<u16>> = Field::at(78);
    pub const VER: Field<Le<u32>> = Field::at(80);
    pub const OAES: Field<Le<u32>> = Field::at(92);
    pub const CNTRLTYPE: Field<u8> = Field::at(111);
    pub const ACL: Field<u8> = Field::at(258);
    pub const AERL: Field<u8> = Field::at(259);
    pub const FRMW: Field<u8> = Field::at(260);
    pub const LPA: Field<u8> = Field::at(261);
    pub const ELPE: Field<u8> = Field::at(262);
    pub const KAS: Field<Le<u16>> = Field::at(320);
    /// Bytes 342..352 (base spec 2.0, Figure 312). One byte off, Linux
    /// reads a huge ANAGRPMAX, finds the ANA log larger than MDTS and
    /// silently disables ANA (multipath then ignores the states).
    pub const ANATT: Field<u8> = Field::at(342);
    pub const ANACAP: Field<u8> = Field::at(343);
    pub const ANAGRPMAX: Field<Le<u32>> = Field::at(344);
    pub const NANAGRPID: Field<Le<u32>> = Field::at(348);
    pub const SQES: Field<u8> = Field::at(512);
    pub const CQES: Field<u8> = Field::at(513);
    pub const MAXCMD: Field<Le<u16>> = Field::at(514);
    pub const NN: Field<Le<u32>> = Field::at(516);
    pub const ONCS: Field<Le<u16>> = Field::at(520);
    pub const VWC: Field<u8> = Field::at(525);
    pub const SGLS: Field<Le<u32>> = Field::at(536);
    pub const MNAN: Field<Le<u32>> = Field::at(540);
    pub const IOCCSZ: Field<Le<u32>> = Field::at(1792);
    pub const IORCSZ: Field<Le<u32>> = Field::at(1796);
    pub const ICDOFF: Field<Le<u16>> = Field::at(1800);
    pub const FCATT: Field<u8> = Field::at(1802);
    pub const MSDBD: Field<u8> = Field::at(1803);
    pub const OFCS: Field<Le<u16>> = Field::at(1804);
    /// Power state descriptor 0: maximum power.
    pub const PSD0_MP: Field<Le<u16>> = Field::at(2048);
}

/// Identify Namespace fields (NVM command set), each defined once.
pub mod ns {
    use bw_wire::{Field, Le};

    pub const NSZE: Field<Le<u64>> = Field::at(0);
    pub const NCAP: Field<Le<u64>> = Field::at(8);
    pub const NUSE: Field<Le<u64>> = Field::at(16);
    pub const NSFEAT: Field<u8> = Field::at(24);
    pub const NLBAF: Field<u8> = Field::at(25);
    pub const FLBAS: Field<u8> = Field::at(26);
    pub const NMIC: Field<u8> = Field::at(30);
    pub const RESCAP: Field<u8> = Field::at(31);
    pub const DLFEAT: Field<u8> = Field::at(33);
    pub const ANAGRPID: Field<Le<u32>> = Field::at(92);
    pub const NSATTR: Field<u8> = Field::at(99);
    pub const NGUID: Field<[u8; 16]> = Field::at(104);
    pub const EUI64: Field<[u8; 8]> = Field::at(120);
    /// LBA format `n`'s LBA data size (log2 of the block size).
    pub const fn lbaf_lbads(n: usize) -> Field<u8> {
        Field::at(128 + n * 4 + 2)
    }
}

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
pub const ONCS_RESERVATIONS: u16 = 1 << 5;

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
    /// Keyed SGL data block descriptors (the RDMA transport's).
    pub keyed_sgls: bool,
}

pub fn controller(p: &CtrlParams) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    put_str(&mut b[4..24], &p.serial, b' ');
    put_str(&mut b[24..64], &p.model, b' ');
    put_str(&mut b[64..72], &p.firmware, b' ');
    ctrl::RAB.set(&mut b, 6); // recommended arbitration burst
    // Several ports (gateways), several controllers, ANA reporting.
    ctrl::CMIC.set(&mut b, 1 << 0 | 1 << 1 | if p.cntrltype == CNTRLTYPE_IO { crate::ana::CMIC_ANA } else { 0 });
    ctrl::MDTS.set(&mut b, p.mdts);
    ctrl::CNTLID.set(&mut b, p.cntlid);
    ctrl::VER.set(&mut b, VERSION);
    if p.cntrltype == CNTRLTYPE_IO {
        // Namespace attribute and ANA change notices.
        ctrl::OAES.set(&mut b, 1 << 8 | crate::ana::OAES_ANA_CHANGE);
        ctrl::ANATT.set(&mut b, crate::ana::TRANSITION_TIME_S);
        ctrl::ANACAP.set(&mut b, crate::ana::ANACAP);
        ctrl::ANAGRPMAX.set(&mut b, crate::ana::MAX_GROUPS);
        ctrl::NANAGRPID.set(&mut b, crate::ana::MAX_GROUPS);
    }
    ctrl::CNTRLTYPE.set(&mut b, p.cntrltype);
    ctrl::ACL.set(&mut b, 3); // zero-based
    ctrl::AERL.set(&mut b, p.aerl);
    ctrl::FRMW.set(&mut b, 0x03); // one slot, slot 1 read-only
    ctrl::LPA.set(&mut b, 0x06); // commands supported and effects log, extended data
    ctrl::ELPE.set(&mut b, 0); // one error log entry (zero-based)
    ctrl::KAS.set(&mut b, p.kas);
    ctrl::SQES.set(&mut b, 0x66); // 64 bytes
    ctrl::CQES.set(&mut b, 0x44); // 16 bytes
    ctrl::MAXCMD.set(&mut b, p.maxcmd);
    ctrl::NN.set(&mut b, p.nn);
    ctrl::ONCS.set(&mut b, p.oncs);
    // Present, and Flush with NSID FFFFFFFFh supported.
    ctrl::VWC.set(&mut b, if p.vwc { 0x07 } else { 0x06 });
    // SGLs supported (byte aligned), offsets in data block descriptors
    // (in-capsule data), and on RDMA keyed data blocks (Linux's nvme-rdma
    // refuses a controller without them).
    ctrl::SGLS.set(&mut b, (1 << 0) | (1 << 20) | if p.keyed_sgls { 1 << 2 } else { 0 });
    // Linux refuses an ANA-reporting controller whose MNAN is 0 or above NN
    // ("Invalid MNAN value"), and sizes its ANA log buffer by it.
    ctrl::MNAN.set(&mut b, p.nn);
    put_str(&mut b[768..1023], &p.subnqn, 0);
    ctrl::IOCCSZ.set(&mut b, p.ioccsz);
    ctrl::IORCSZ.set(&mut b, p.iorcsz);
    ctrl::ICDOFF.set(&mut b, 0);
    ctrl::FCATT.set(&mut b, 0); // dynamic controller model
    ctrl::MSDBD.set(&mut b, 1); // one SGL descriptor per command
    ctrl::OFCS.set(&mut b, 1); // Disconnect supported
    ctrl::PSD0_MP.set(&mut b, 0x09C4); // 25 W (0.01 W units)
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
            cntlid: ctrl::CNTLID.get(b),
            mdts: ctrl::MDTS.get(b),
            maxcmd: ctrl::MAXCMD.get(b),
            nn: ctrl::NN.get(b),
            oncs: ctrl::ONCS.get(b),
            vwc: ctrl::VWC.get(b),
            sgls: ctrl::SGLS.get(b),
            kas: ctrl::KAS.get(b),
            ioccsz: ctrl::IOCCSZ.get(b),
            iorcsz: ctrl::IORCSZ.get(b),
            icdoff: ctrl::ICDOFF.get(b),
            cntrltype: ctrl::CNTRLTYPE.get(b),
            serial: get_str(&b[4..24]),
            model: get_str(&b[24..64]),
            subnqn: get_str(&b[768..1024]),
        })
    }
}

pub fn namespace(n: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let blocks = n.blocks();
    ns::NSZE.set(&mut b, blocks);
    ns::NCAP.set(&mut b, blocks);
    ns::NUSE.set(&mut b, blocks);
    ns::NSFEAT.set(&mut b, if n.volume.info().supports_discard { 1 } else { 0 }); // thin provisioning
    ns::NLBAF.set(&mut b, 0); // one format (zero-based)
    ns::FLBAS.set(&mut b, 0); // format 0
    ns::NMIC.set(&mut b, 1); // may be shared by several controllers
    ns::RESCAP.set(&mut b, crate::reservation::RESCAP);
    // Deallocated blocks read as zeroes; Write Zeroes may deallocate.
    ns::DLFEAT.set(&mut b, 0x01 | 0x08);
    ns::ANAGRPID.set(&mut b, n.ana_group);
    ns::NSATTR.set(&mut b, n.read_only() as u8); // write protected
    ns::NGUID.set(&mut b, n.nguid);
    ns::EUI64.set(&mut b, n.eui64.unwrap_or_default());
    ns::lbaf_lbads(0).set(&mut b, crate::LBA_SHIFT as u8);
    b
}

/// (size in blocks, block size in bytes, read-only) from Identify Namespace.
pub fn parse_namespace(b: &[u8]) -> Option<(u64, u32, bool)> {
    if b.len() < LEN {
        return None;
    }
    let fmt = (ns::FLBAS.get(b) & 0x0F) as usize;
    let lbads = ns::lbaf_lbads(fmt).get(b);
    if !(9..=16).contains(&lbads) {
        return None;
    }
    Some((ns::NSZE.get(b), 1u32 << lbads, ns::NSATTR.get(b) & 1 != 0))
}

/// NSIDs active for host `hostnqn` (the namespaces it sees) greater than
/// `after`, ascending, up to 1024.
pub fn active_ns_list(s: &Subsystem, after: u32, hostnqn: &str) -> Vec<u8> {
    let mut ids: Vec<u32> = s.namespaces.iter().filter(|n| n.visible_to(hostnqn)).map(|n| n.nsid).filter(|&n| n > after).collect();
    ids.sort_unstable();
    let mut b = vec![0u8; LEN];
    for (i, id) in ids.iter().take(LEN / 4).enumerate() {
        Field::<Le<u32>>::at(i * 4).set(&mut b, *id);
    }
    b
}

/// Namespace identification descriptors: EUI-64 (when set), NGUID, UUID
/// and command set (NVM).
pub fn ns_descriptors(ns: &Namespace) -> Vec<u8> {
    let mut b = vec![0u8; LEN];
    let mut o = 0;
    let eui64 = ns.eui64.as_ref().map(|e| (1u8, &e[..]));
    for (nidt, id) in eui64.into_iter().chain([(2u8, &ns.nguid[..]), (3u8, &ns.uuid[..]), (4u8, &[0u8][..])]) {
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

    /// The spec's offsets, independently of the field table.
    fn le32(b: &[u8], at: usize) -> u32 {
        Field::<Le<u32>>::at(at).get(b)
    }

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
            oncs: ONCS_COMPARE | ONCS_DSM | ONCS_WRITE_ZEROES | ONCS_RESERVATIONS,
            keyed_sgls: false,
        };
        let b = controller(&p);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[78..80], &[5, 0]);
        assert_eq!(&b[320..322], &[10, 0]);
        assert_eq!(&b[1792..1800], &[4, 1, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[1800..1802], &[0, 0]);
        assert_eq!(&b[536..540], &[1, 0, 0x10, 0]);
        assert_eq!(&b[520..522], &[0x2D, 0]); // compare, DSM, write zeroes, reservations
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
        assert_eq!(&b[104..128], &[&n.uuid[..], &[0; 8]].concat());
        // Set apart: EUI-64 first, then the NGUID, then the UUID.
        let mut m = n.clone();
        (m.uuid, m.nguid, m.eui64) = ([1; 16], [2; 16], Some([3; 8]));
        let b = namespace(&m);
        assert_eq!(&b[104..128], &[[2; 16].as_slice(), &[3; 8]].concat());
        let d = ns_descriptors(&m);
        assert_eq!(&d[..12], &[1, 8, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3]);
        assert_eq!((&d[12..16], &d[16..32]), (&[2, 16, 0, 0][..], &[2; 16][..]));
        assert_eq!((&d[32..36], &d[36..52]), (&[3, 16, 0, 0][..], &[1; 16][..]));
        let s = Subsystem { nqn: "nqn.x:y".into(), serial: "s".into(), model: "m".into(), namespaces: vec![n.clone(), Namespace::new("nqn.x:y", 7, n.volume.clone(), false)], allowed_hosts: vec![], ana: Default::default() };
        let l = active_ns_list(&s, 0, "h");
        assert_eq!(&l[..12], &[1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        let l = active_ns_list(&s, 1, "h");
        assert_eq!(&l[..8], &[7, 0, 0, 0, 0, 0, 0, 0]);
        // Namespace 1 shown only to host "a": "b" lists 7 alone.
        let mut s = s;
        s.namespaces[0].visible_to = Some(vec!["a".into()]);
        assert_eq!(&active_ns_list(&s, 0, "a")[..12], &[1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&active_ns_list(&s, 0, "b")[..8], &[7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
