//! Log pages: error information, SMART / health, firmware slots, changed
//! namespace list and the discovery log (the commands supported and effects
//! log comes from the command table, [`crate::command_table::effects_log`]).

use crate::queue_entry::{admin, Sqe};
use crate::subsystem::Subsystem;
use crate::{get_str, le16, le32, le64, put16, put32, put64, put_str};

pub mod lid {
    pub const SUPPORTED: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0C;
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
pub const NVM_PAGES: [u8; 7] = [lid::SUPPORTED, lid::ERROR, lid::SMART, lid::FW_SLOT, lid::CHANGED_NS, lid::CMD_EFFECTS, lid::ANA];

/// Supported Log Pages (base spec 2.0 5.16.1.1): one dword per log id,
/// bit 0 LSUPP (supported), bit 1 IOS (index offset) never set.
pub fn supported_pages(lids: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 1024];
    for &l in lids {
        put32(&mut b, l as usize * 4, 1);
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
    put16(&mut b, 1, 273 + 30); // composite temperature, kelvin
    b[3] = 100; // available spare
    b[4] = 10; // available spare threshold
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
    put64(&mut b, 32, (rb / 512).div_ceil(1000));
    put64(&mut b, 48, (wb / 512).div_ceil(1000));
    put64(&mut b, 64, rc);
    put64(&mut b, 80, wc);
    b
}

pub fn firmware_slots(fw: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // active slot 1
    put_str(&mut b[8..16], fw, b' ');
    b
}

/// Changed namespace list (up to 1024 NSIDs).
pub fn changed_ns(ids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    if ids.len() > 1024 {
        put32(&mut b, 0, 0xFFFF_FFFF);
    } else {
        for (i, id) in ids.iter().enumerate() {
            put32(&mut b, i * 4, *id);
        }
    }
    b
}

/// One discovery log entry: a subsystem reachable at a TCP port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    pub subnqn: String,
    pub traddr: String,
    pub trsvcid: String,
    pub portid: u16,
    /// 2 = NVM subsystem, 3 = this discovery controller.
    pub subtype: u8,
}

pub const TRTYPE_TCP: u8 = 3;
pub const ADRFAM_IPV4: u8 = 1;
pub const ADRFAM_IPV6: u8 = 2;
pub const SUBTYPE_NVME: u8 = 2;
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;

pub fn discovery_log(genctr: u64, entries: &[DiscoveryEntry]) -> Vec<u8> {
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    put64(&mut b, 0, genctr);
    put64(&mut b, 8, entries.len() as u64);
    put16(&mut b, 16, 0); // recfmt
    for (i, e) in entries.iter().enumerate() {
        let r = &mut b[1024 * (i + 1)..1024 * (i + 2)];
        r[0] = TRTYPE_TCP;
        r[1] = if e.traddr.contains(':') { ADRFAM_IPV6 } else { ADRFAM_IPV4 };
        r[2] = e.subtype;
        r[3] = 0x02 | 0x04; // TREQ: secure channel not required; SQ flow control disable supported
        put16(r, 4, e.portid);
        put16(r, 6, 0xFFFF); // dynamic controller
        put16(r, 8, 32); // admin max SQ size
        put_str(&mut r[32..64], &e.trsvcid, b' ');
        put_str(&mut r[256..512], &e.subnqn, 0);
        put_str(&mut r[512..768], &e.traddr, b' ');
        r[768] = 0; // TSAS: no security
    }
    b
}

/// (genctr, entries) from a discovery log page as read from a controller.
pub fn parse_discovery_log(b: &[u8]) -> Option<(u64, Vec<DiscoveryEntry>)> {
    if b.len() < 1024 {
        return None;
    }
    let n = le64(b, 8) as usize;
    let avail = (b.len() / 1024).saturating_sub(1);
    let mut v = Vec::new();
    for i in 0..n.min(avail) {
        let r = &b[1024 * (i + 1)..1024 * (i + 2)];
        v.push(DiscoveryEntry {
            subnqn: get_str(&r[256..512]),
            traddr: get_str(&r[512..768]),
            trsvcid: get_str(&r[32..64]),
            portid: le16(r, 4),
            subtype: r[2],
        });
    }
    let _ = le32;
    Some((le64(b, 0), v))
}

/// Number of records a discovery log header announces.
pub fn discovery_numrec(b: &[u8]) -> Option<u64> {
    (b.len() >= 16).then(|| le64(b, 8))
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
        let e = DiscoveryEntry { subnqn: "nqn.2026-11.org.blockwire:x".into(), traddr: "127.0.0.1".into(), trsvcid: "4420".into(), portid: 1, subtype: SUBTYPE_NVME };
        let b = discovery_log(7, std::slice::from_ref(&e));
        assert_eq!(b.len(), 2048);
        assert_eq!(&b[0..16], &[7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[1024..1032], &[3, 1, 2, 6, 1, 0, 0xFF, 0xFF]);
        assert_eq!(&b[1024 + 32..1024 + 37], b"4420 ");
        assert_eq!(&b[1024 + 512..1024 + 522], b"127.0.0.1 ");
        assert_eq!(parse_discovery_log(&b), Some((7, vec![e])));
    }

    #[test]
    fn effects_and_smart() {
        let b = crate::command_table::effects_log();
        assert_eq!(&b[1024 + 4..1024 + 8], &[3, 0, 0, 0]); // write: supported + LBCC
        assert_eq!(&b[1024 + 8..1024 + 12], &[1, 0, 0, 0]); // read
        assert_eq!(&b[0x18 * 4..0x18 * 4 + 4], &[1, 0, 0, 0]); // keep alive
        let s = smart(None);
        assert_eq!(s[3], 100);
        assert_eq!(changed_ns(&[3])[..4], [3, 0, 0, 0]);
        let p = supported_pages(&NVM_PAGES);
        assert_eq!(p.len(), 1024);
        assert_eq!(&p[..24], &[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&p[0x0C * 4..0x0C * 4 + 4], &[1, 0, 0, 0]); // ANA
        assert!(p[24..0x0C * 4].iter().chain(&p[0x0D * 4..]).all(|&b| b == 0));
    }
}
