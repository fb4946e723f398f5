//! Log pages: error information, SMART / health, firmware slots, changed
//! namespace list and the discovery log (the commands supported and effects
//! log comes from the command table, [`crate::command_table::effects_log`]).

use crate::queue_entry::{admin, Sqe};
use crate::subsystem::Subsystem;
use crate::{get_str, put_str};
use bw_wire::{Field, Le};

/// A list of dwords (log ids, NSIDs): entry `i`.
const fn dword(i: usize) -> Field<Le<u32>> {
    Field::at(i * 4)
}

/// SMART / Health Information fields.
mod smart {
    use bw_wire::{Field, Le};

    pub const COMPOSITE_TEMPERATURE: Field<Le<u16>> = Field::at(1);
    pub const AVAILABLE_SPARE: Field<u8> = Field::at(3);
    pub const AVAILABLE_SPARE_THRESHOLD: Field<u8> = Field::at(4);
    /// Data units read and written: low 64 bits of 128-bit counters.
    pub const DATA_UNITS_READ: Field<Le<u64>> = Field::at(32);
    pub const DATA_UNITS_WRITTEN: Field<Le<u64>> = Field::at(48);
    pub const HOST_READS: Field<Le<u64>> = Field::at(64);
    pub const HOST_WRITES: Field<Le<u64>> = Field::at(80);
}

/// Discovery log page fields: the header, then 1024-byte entries.
mod discovery {
    use bw_wire::{Field, Le};

    pub const GENCTR: Field<Le<u64>> = Field::at(0);
    pub const NUMREC: Field<Le<u64>> = Field::at(8);
    pub const RECFMT: Field<Le<u16>> = Field::at(16);
    // One entry.
    pub const TRTYPE: Field<u8> = Field::at(0);
    pub const ADRFAM: Field<u8> = Field::at(1);
    pub const SUBTYPE: Field<u8> = Field::at(2);
    pub const TREQ: Field<u8> = Field::at(3);
    pub const PORTID: Field<Le<u16>> = Field::at(4);
    pub const CNTLID: Field<Le<u16>> = Field::at(6);
    pub const ASQSZ: Field<Le<u16>> = Field::at(8);
    /// Transport specific address subtype: for TCP its first byte is
    /// SECTYPE; for RDMA the bytes below.
    pub const TSAS: Field<u8> = Field::at(768);
    pub const RDMA_QPTYPE: Field<u8> = Field::at(768);
    pub const RDMA_PRTYPE: Field<u8> = Field::at(769);
    pub const RDMA_CMS: Field<u8> = Field::at(770);
    pub const RDMA_PKEY: Field<Le<u16>> = Field::at(776);
}

pub mod lid {
    pub const SUPPORTED: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0C;
    pub const RESERVATION: u8 = 0x80;
    pub const DISCOVERY: u8 = 0x70;
}

/// The fields of a Get Log Page command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRequest {
    pub lid: u8,
    /// Retain asynchronous event.
    pub rae: bool,
    /// Bytes asked for.
    pub len: usize,
    /// Byte offset into the page.
    pub offset: u64,
}

impl LogRequest {
    pub fn parse(s: &Sqe) -> LogRequest {
        let c10 = s.cdw(10);
        let numd = ((s.cdw(11) as u64 & 0xFFFF) << 16 | (c10 >> 16) as u64) + 1;
        LogRequest {
            lid: c10 as u8,
            rae: c10 & (1 << 15) != 0,
            len: (numd * 4) as usize,
            offset: (s.cdw(13) as u64) << 32 | s.cdw(12) as u64,
        }
    }
    pub fn to_sqe(&self, cid: u16, nsid: u32) -> Sqe {
        let mut s = Sqe::new(admin::GET_LOG_PAGE, cid, nsid);
        let numd = (self.len / 4).max(1) as u32 - 1;
        s.set_cdw(10, self.lid as u32 | (self.rae as u32) << 15 | (numd & 0xFFFF) << 16);
        s.set_cdw(11, numd >> 16);
        s.set_cdw(12, self.offset as u32);
        s.set_cdw(13, (self.offset >> 32) as u32);
        s
    }
}

/// The part of `page` a request asks for, zero-filled past its end. None if
/// the offset is beyond the page (Invalid Field).
pub fn window(page: &[u8], r: &LogRequest) -> Option<Vec<u8>> {
    if r.offset > page.len() as u64 || !r.offset.is_multiple_of(4) {
        return None;
    }
    let start = r.offset as usize;
    let mut out = vec![0u8; r.len];
    let n = (page.len() - start).min(r.len);
    out[..n].copy_from_slice(&page[start..start + n]);
    Some(out)
}

/// The pages an I/O controller serves, listed in the Supported Log Pages log.
pub const NVM_PAGES: [u8; 8] = [lid::SUPPORTED, lid::ERROR, lid::SMART, lid::FW_SLOT, lid::CHANGED_NS, lid::CMD_EFFECTS, lid::ANA, lid::RESERVATION];

/// Supported Log Pages (base spec 2.0 5.16.1.1): one dword per log id,
/// bit 0 LSUPP (supported), bit 1 IOS (index offset) never set.
pub fn supported_pages(lids: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 1024];
    for &l in lids {
        dword(l as usize).set(&mut b, 1);
    }
    b
}

/// One empty error log entry (64 bytes): no errors are recorded.
pub fn error_log() -> Vec<u8> {
    vec![0u8; 64]
}

/// SMART / health information from the namespaces' I/O counters.
pub fn smart(s: Option<&Subsystem>) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    smart::COMPOSITE_TEMPERATURE.set(&mut b, 273 + 30); // kelvin
    smart::AVAILABLE_SPARE.set(&mut b, 100);
    smart::AVAILABLE_SPARE_THRESHOLD.set(&mut b, 10);
    let (mut rb, mut wb, mut rc, mut wc) = (0u64, 0u64, 0u64, 0u64);
    if let Some(s) = s {
        for n in &s.namespaces {
            let st = n.volume.stats();
            rb += st.read_bytes;
            wb += st.written_bytes;
            rc += st.reads;
            wc += st.writes;
        }
    }
    // Data units are thousands of 512-byte units, rounded up.
    smart::DATA_UNITS_READ.set(&mut b, (rb / 512).div_ceil(1000));
    smart::DATA_UNITS_WRITTEN.set(&mut b, (wb / 512).div_ceil(1000));
    smart::HOST_READS.set(&mut b, rc);
    smart::HOST_WRITES.set(&mut b, wc);
    b
}

pub fn firmware_slots(fw: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // active slot 1
    put_str(&mut b[8..16], fw, b' ');
    b
}

/// Reservation Notification log page (base 2.0, 5.16.1.26): one entry
/// (Log Page Count, type, Number of Available Log Pages after it, NSID),
/// or an empty page when there is none.
pub fn reservation_notice(entry: Option<(u64, u8, u32)>, more: usize) -> Vec<u8> {
    use bw_wire::{Field, Le};
    let mut b = vec![0u8; 64];
    if let Some((count, kind, nsid)) = entry {
        Field::<Le<u64>>::at(0).set(&mut b, count);
        b[8] = kind;
        b[9] = more.min(255) as u8;
        Field::<Le<u32>>::at(12).set(&mut b, nsid);
    }
    b
}

/// Changed namespace list (up to 1024 NSIDs).
pub fn changed_ns(ids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if ids.len() > 1024 {
        dword(0).set(&mut b, 0xFFFF_FFFF);
    } else {
        for (i, id) in ids.iter().enumerate() {
            dword(i).set(&mut b, *id);
        }
    }
    b
}

/// One discovery log entry: a subsystem reachable at a TCP or RDMA port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// [`TRTYPE_TCP`] or [`TRTYPE_RDMA`].
    pub trtype: u8,
    pub subnqn: String,
    pub traddr: String,
    pub trsvcid: String,
    pub portid: u16,
    /// 2 = NVM subsystem, 3 = this discovery controller.
    pub subtype: u8,
    /// TCP: whether the port requires, allows or does not offer TLS.
    pub tls: SecureChannel,
}

/// An NVMe/TCP port's secure channel (TLS 1.3, NVMe/TCP TP 8011), as its
/// discovery log entries say it: TREQ bits 1:0 and the TCP TSAS's SECTYPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum SecureChannel {
    /// No TLS: TREQ "not required", SECTYPE none.
    #[default]
    None,
    /// TLS or plaintext: TREQ "not required", SECTYPE TLS 1.3 (what Linux's
    /// nvmet says with addr_treq "not required" and addr_tsas tls1.3).
    Allowed,
    /// TLS only: TREQ "required", SECTYPE TLS 1.3 (nvme-cli's connect-all
    /// then connects with --tls).
    Required,
}

impl SecureChannel {
    pub fn name(self) -> &'static str {
        match self {
            SecureChannel::None => "none",
            SecureChannel::Allowed => "allowed",
            SecureChannel::Required => "required",
        }
    }
    /// Whether a host may connect without TLS.
    pub fn plaintext_ok(self) -> bool {
        self != SecureChannel::Required
    }
    /// Whether a host may connect with TLS.
    pub fn tls_ok(self) -> bool {
        self != SecureChannel::None
    }
}

pub const TRTYPE_RDMA: u8 = 1;
pub const TRTYPE_TCP: u8 = 3;
pub const ADRFAM_IPV4: u8 = 1;
pub const ADRFAM_IPV6: u8 = 2;
pub const SUBTYPE_NVME: u8 = 2;
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ: a secure channel is required.
const TREQ_REQUIRED: u8 = 0x01;
/// TREQ: a secure channel is not required.
const TREQ_NOT_REQUIRED: u8 = 0x02;
const TREQ_SECURE_CHANNEL: u8 = 0x03;
/// TCP SECTYPE: no security; TLS 1.3 (1 was TLS 1.2, obsolete).
pub const SECTYPE_NONE: u8 = 0;
pub const SECTYPE_TLS13: u8 = 2;
/// TREQ: the controller lets a host disable SQ flow control (Connect CATTR).
const TREQ_DISABLE_SQFLOW: u8 = 0x04;
/// RDMA TSAS values (NVMe-oF 1.1 figure 49): a reliable connected queue
/// pair, a provider we do not name (one listener may sit on a RoCE v2, an
/// InfiniBand or an iWARP device; Linux's nvmet says the same), addressed
/// through the RDMA connection manager.
pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
pub const RDMA_CMS_RDMA_CM: u8 = 1;

pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    discovery::GENCTR.set(&mut b, genctr);
    discovery::NUMREC.set(&mut b, entries.len() as u64);
    discovery::RECFMT.set(&mut b, 0);
    for (i, e) in entries.iter().enumerate() {
        let r = &mut b[1024 * (i + 1)..1024 * (i + 2)];
        discovery::TRTYPE.set(r, e.trtype);
        discovery::ADRFAM.set(r, if e.traddr.contains(':') { ADRFAM_IPV6 } else { ADRFAM_IPV4 });
        discovery::SUBTYPE.set(r, e.subtype);
        // The RDMA queue keeps SQ flow control (its SQ head is what frees
        // the host's receive buffers): only TCP offers to disable it.
        let secure = if e.trtype == TRTYPE_TCP && e.tls == SecureChannel::Required { TREQ_REQUIRED } else { TREQ_NOT_REQUIRED };
        let treq = if e.trtype == TRTYPE_TCP { secure | TREQ_DISABLE_SQFLOW } else { secure };
        discovery::TREQ.set(r, treq);
        discovery::PORTID.set(r, e.portid);
        discovery::CNTLID.set(r, 0xFFFF); // dynamic controller
        discovery::ASQSZ.set(r, 32); // admin max SQ size
        put_str(&mut r[32..64], &e.trsvcid, b' ');
        put_str(&mut r[256..512], &e.subnqn, 0);
        put_str(&mut r[512..768], &e.traddr, b' ');
        if e.trtype == TRTYPE_RDMA {
            discovery::RDMA_QPTYPE.set(r, RDMA_QPTYPE_CONNECTED);
            discovery::RDMA_PRTYPE.set(r, RDMA_PRTYPE_NOT_SPECIFIED);
            discovery::RDMA_CMS.set(r, RDMA_CMS_RDMA_CM);
            discovery::RDMA_PKEY.set(r, 0); // no partition key (not InfiniBand)
        } else {
            discovery::TSAS.set(r, if e.tls.tls_ok() { SECTYPE_TLS13 } else { SECTYPE_NONE });
        }
    }
    b
}

/// (genctr, entries) from a discovery log page as read from a controller.
pub fn parse_discovery_log(b: &[u8]) -> Option<(u64, Vec<DiscoveryEntry>)> {
    if b.len() < 1024 {
        return None;
    }
    let n = discovery::NUMREC.get(b) as usize;
    let avail = (b.len() / 1024).saturating_sub(1);
    let mut v = Vec::new();
    for i in 0..n.min(avail) {
        let r = &b[1024 * (i + 1)..1024 * (i + 2)];
        v.push(DiscoveryEntry {
            trtype: discovery::TRTYPE.get(r),
            subnqn: get_str(&r[256..512]),
            traddr: get_str(&r[512..768]),
            trsvcid: get_str(&r[32..64]),
            portid: discovery::PORTID.get(r),
            subtype: discovery::SUBTYPE.get(r),
            tls: match (discovery::TRTYPE.get(r), discovery::TREQ.get(r) & TREQ_SECURE_CHANNEL, discovery::TSAS.get(r)) {
                (TRTYPE_TCP, TREQ_REQUIRED, SECTYPE_TLS13) => SecureChannel::Required,
                (TRTYPE_TCP, _, SECTYPE_TLS13) => SecureChannel::Allowed,
                _ => SecureChannel::None,
            },
        });
    }
    Some((discovery::GENCTR.get(b), v))
}

/// Number of records a discovery log header announces.
pub fn discovery_numrec(b: &[u8]) -> Option<u64> {
    discovery::NUMREC.try_get(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_log_page_fields() {
        let r = LogRequest { lid: lid::DISCOVERY, rae: true, len: 4096, offset: 1024 };
        let s = r.to_sqe(3, 0);
        assert_eq!(s.cdw(10), 0x70 | 1 << 15 | 1023 << 16);
        assert_eq!(s.cdw(12), 1024);
        assert_eq!(LogRequest::parse(&s), r);
        let page = vec![1u8; 100];
        assert_eq!(window(&page, &LogRequest { lid: 1, rae: false, len: 8, offset: 96 }).unwrap(), vec![1, 1, 1, 1, 0, 0, 0, 0]);
        assert!(window(&page, &LogRequest { lid: 1, rae: false, len: 8, offset: 104 }).is_none());
    }

    #[test]
    fn discovery_log_layout() {
        let e = DiscoveryEntry { trtype: TRTYPE_TCP, subnqn: "nqn.2026-11.org.blockwire:x".into(), traddr: "127.0.0.1".into(), trsvcid: "4420".into(), portid: 1, subtype: SUBTYPE_NVME, tls: SecureChannel::None };
        let rdma = DiscoveryEntry { trtype: TRTYPE_RDMA, traddr: "fd00::7".into(), trsvcid: "4421".into(), portid: 2, ..e.clone() };
        let b = discovery_log(7, &[e.clone(), rdma.clone()]);
        assert_eq!(b.len(), 3072);
        assert_eq!(&b[0..16], &[7, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[1024..1032], &[3, 1, 2, 6, 1, 0, 0xFF, 0xFF]);
        assert_eq!(&b[1024 + 32..1024 + 37], b"4420 ");
        assert_eq!(&b[1024 + 512..1024 + 522], b"127.0.0.1 ");
        assert_eq!(b[1024 + 768], 0, "TCP SECTYPE none");
        // RDMA, IPv6, TREQ not required (SQ flow control kept), port 2.
        let r = &b[2048..3072];
        assert_eq!(&r[..8], &[1, 2, 2, 2, 2, 0, 0xFF, 0xFF]);
        assert_eq!(&r[768..778], &[1, 1, 1, 0, 0, 0, 0, 0, 0, 0], "TSAS: connected, provider not specified, RDMA CM, no P_Key");
        assert_eq!(&r[512..520], b"fd00::7 ");
        assert_eq!(parse_discovery_log(&b), Some((7, vec![e.clone(), rdma])));
    }

    /// TREQ and SECTYPE as Linux's nvmet writes them for addr_treq
    /// "required"/"not required" with addr_tsas "tls1.3", and as libnvme's
    /// connect-all reads them (TLS whenever SECTYPE is not none).
    #[test]
    fn discovery_log_says_tls() {
        let base = DiscoveryEntry { trtype: TRTYPE_TCP, subnqn: "nqn.x:s".into(), traddr: "10.0.0.1".into(), trsvcid: "4420".into(), portid: 1, subtype: SUBTYPE_NVME, tls: SecureChannel::None };
        for (tls, treq, sectype) in [(SecureChannel::None, 0x06, 0), (SecureChannel::Allowed, 0x06, 2), (SecureChannel::Required, 0x05, 2)] {
            let e = DiscoveryEntry { tls, ..base.clone() };
            let b = discovery_log(1, std::slice::from_ref(&e));
            assert_eq!((b[1024 + 3], b[1024 + 768]), (treq, sectype), "{tls:?}");
            assert_eq!(parse_discovery_log(&b).unwrap().1, vec![e]);
        }
    }

    #[test]
    fn smart_changed_ns_and_supported_pages() {
        let s = smart(None);
        assert_eq!(s[3], 100);
        assert_eq!(changed_ns(&[3])[..4], [3, 0, 0, 0]);
        let p = supported_pages(&NVM_PAGES);
        assert_eq!(p.len(), 1024);
        assert_eq!(&p[..24], &[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&p[0x0C * 4..0x0C * 4 + 4], &[1, 0, 0, 0]); // ANA
        assert_eq!(&p[0x80 * 4..0x80 * 4 + 4], &[1, 0, 0, 0]); // reservation notifications
        assert!(p[24..0x0C * 4].iter().chain(&p[0x0D * 4..0x80 * 4]).chain(&p[0x81 * 4..]).all(|&b| b == 0));
    }
}
