//! INQUIRY: standard data and the vital product data pages a Linux, Windows
//! or VMware initiator reads to configure a disk.

use crate::cdb::field::*;
use crate::limits::*;
use crate::sense::Sense;
use crate::Lun;


/// Locally administered company id (U/L bit set) for our NAA designators.
const LOCAL_OUI: u64 = 0x02_6277;

const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2];

fn ascii_field(out: &mut Vec<u8>, s: &str, width: usize) {
    let mut n = 0;
    for b in s.bytes().filter(|b| (0x20..0x7f).contains(b)).take(width) {
        out.push(b);
        n += 1;
    }
    out.resize(out.len() + (width - n), b' ');
}

/// The 16-byte NAA IEEE Registered Extended (type 6) designator for a LUN.
pub fn naa_designator(naa_id: u64) -> [u8; 16] {
    let vendor_specific = (naa_id >> 28) & 0xf_ffff_ffff; // 36 bits
    let high = (0x6u64 << 60) | (LOCAL_OUI << 36) | vendor_specific;
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&high.to_be_bytes());
    d[8..].copy_from_slice(&naa_id.to_be_bytes());
    d
}

/// INQUIRY for `lun` (`None` = not mapped: peripheral qualifier 3).
pub fn inquiry(lun: Option<&Lun>, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    let evpd = INQUIRY_EVPD.get(cdb);
    // CMDDT is obsolete and the bits above it reserved.
    if cdb[INQUIRY_EVPD.offset()] & !INQUIRY_EVPD.bit() != 0 {
        return Err(Sense::invalid_in_cdb(INQUIRY_CMDDT));
    }
    let page = INQUIRY_PAGE_CODE.get(cdb);
    let peripheral = if lun.is_some() { 0x00 } else { 0x7f };
    if !evpd {
        if page != 0 {
            return Err(Sense::invalid_in_cdb(INQUIRY_PAGE_CODE));
        }
        standard(lun, peripheral, out);
    } else {
        match lun {
            Some(l) => vpd(l, page, out)?,
            None if page == 0 => out.extend_from_slice(&[peripheral, 0, 0, 1, 0]),
            None => return Err(Sense::invalid_in_cdb(INQUIRY_PAGE_CODE)),
        }
        out[0] = peripheral;
    }
    Ok(())
}

fn standard(lun: Option<&Lun>, peripheral: u8, out: &mut Vec<u8>) {
    // Byte 5: TPGS (implicit ALUA) for a mapped LUN.
    let tpgs = if lun.is_some() { crate::alua::TPGS_IMPLICIT } else { 0 };
    out.extend_from_slice(&[peripheral, 0x00, 0x06, 0x12, 0, tpgs, 0x00, 0x02]);
    let (vendor, product, revision) = match lun {
        Some(l) => (l.cfg.vendor.as_str(), l.cfg.product.as_str(), l.cfg.revision.as_str()),
        None => ("BLKWIRE", "no such LUN", "0"),
    };
    ascii_field(out, vendor, 8);
    ascii_field(out, product, 16);
    ascii_field(out, revision, 4);
    out.resize(58, 0);
    // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
    for v in [0x00a0u16, 0x0960, 0x0460, 0x04c0] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.resize(96, 0);
    out[4] = (out.len() - 5) as u8;
}

fn vpd(l: &Lun, page: u8, out: &mut Vec<u8>) -> Result<(), Sense> {
    out.extend_from_slice(&[0, page, 0, 0]);
    match page {
        0x00 => out.extend_from_slice(&VPD_PAGES),
        0x80 => ascii_field(out, &l.cfg.serial, l.cfg.serial.len().min(250)),
        0x83 => {
            // NAA designator (LU association), binary.
            out.extend_from_slice(&[0x01, 0x03, 0, 16]);
            out.extend_from_slice(&naa_designator(l.cfg.naa_id));
            // T10 vendor id: vendor + serial (ASCII).
            let mut t10 = Vec::new();
            ascii_field(&mut t10, &l.cfg.vendor, 8);
            ascii_field(&mut t10, &l.cfg.serial, l.cfg.serial.len().min(200));
            out.extend_from_slice(&[0x02, 0x01, 0, t10.len() as u8]);
            out.extend_from_slice(&t10);
            // Relative target port (target port association, iSCSI).
            let port = l.cfg.port_group.relative_port.to_be_bytes();
            out.extend_from_slice(&[0x51, 0x94, 0, 4, 0, 0, port[0], port[1]]);
            // Target port group (target port association, iSCSI).
            let group = l.cfg.port_group.id.to_be_bytes();
            out.extend_from_slice(&[0x51, 0x95, 0, 4, 0, 0, group[0], group[1]]);
        }
        0xb0 => {
            let discard = l.discard;
            out.resize(64, 0);
            out[4] = 0x01; // WSNZ: WRITE SAME with 0 blocks is refused
            out[5] = MAX_COMPARE_AND_WRITE_BLOCKS;
            out[6..8].copy_from_slice(&OPTIMAL_GRANULARITY_BLOCKS.to_be_bytes());
            out[8..12].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes());
            out[12..16].copy_from_slice(&OPTIMAL_TRANSFER_BLOCKS.to_be_bytes());
            if discard {
                out[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
                out[24..28].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
                out[28..32].copy_from_slice(&(OPTIMAL_GRANULARITY_BLOCKS as u32).to_be_bytes());
                out[32..36].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
            }
            out[36..44].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
        }
        0xb1 => {
            out.resize(64, 0);
            out[4..6].copy_from_slice(&1u16.to_be_bytes()); // non-rotating medium
        }
        0xb2 => {
            out.resize(8, 0);
            if l.discard {
                // LBPU, LBPWS, LBPWS10, LBPRZ (punched holes read back as zeroes)
                out[5] = 0x80 | 0x40 | 0x20 | 0x04;
                out[6] = 0x02; // thin provisioned
            }
        }
        _ => return Err(Sense::invalid_in_cdb(INQUIRY_PAGE_CODE)),
    }
    let len = (out.len() - 4) as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}
