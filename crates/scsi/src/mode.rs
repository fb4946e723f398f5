//! MODE SENSE / MODE SELECT over three pages: caching (0x08), control (0x0A)
//! and informational exceptions (0x1C). Two bits are changeable: WCE (when
//! the backend has a write cache to turn off) and SWP (software write
//! protect); nothing can be saved.

use crate::cdb::field::*;
use crate::cdb::{be16, be24};
use crate::sense::Sense;
use crate::Lun;
use std::sync::atomic::Ordering::Relaxed;

const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0a;
const PAGE_INFO_EXCEPTIONS: u8 = 0x1c;
const ALL_PAGES: u8 = 0x3f;
const PAGES: [u8; 3] = [PAGE_CACHING, PAGE_CONTROL, PAGE_INFO_EXCEPTIONS];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pc {
    Current,
    Changeable,
    Default,
}

/// One page in `pc` flavour, including its 2-byte header.
fn page(l: &Lun, code: u8, pc: Pc) -> Vec<u8> {
    match code {
        PAGE_CACHING => {
            let mut p = vec![0u8; 20];
            p[0] = PAGE_CACHING;
            p[1] = 0x12;
            p[2] = match pc {
                Pc::Current => wce_bit(l.wce.load(Relaxed)),
                Pc::Default => wce_bit(l.wce_default),
                Pc::Changeable => wce_bit(l.wce_changeable),
            };
            p
        }
        PAGE_CONTROL => {
            let mut p = vec![0u8; 12];
            p[0] = PAGE_CONTROL;
            p[1] = 0x0a;
            match pc {
                Pc::Changeable => p[4] = 0x08, // SWP
                Pc::Current | Pc::Default => {
                    p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
                    if pc == Pc::Current && l.swp.load(Relaxed) {
                        p[4] = 0x08;
                    }
                    p[8..10].copy_from_slice(&0xffffu16.to_be_bytes()); // busy timeout: unlimited
                }
            }
            p
        }
        _ => {
            let mut p = vec![0u8; 12];
            p[0] = PAGE_INFO_EXCEPTIONS;
            p[1] = 0x0a;
            if pc != Pc::Changeable {
                p[2] = 0x08; // DEXCPT: no informational exception reporting
            }
            p
        }
    }
}

fn wce_bit(on: bool) -> u8 {
    if on {
        0x04
    } else {
        0
    }
}

/// MODE SENSE (6) and (10).
pub fn mode_sense(l: &Lun, cdb: &[u8], ten: bool, out: &mut Vec<u8>) -> Result<(), Sense> {
    let dbd = MODE_SENSE_DBD.get(cdb);
    let llbaa = ten && MODE_SENSE_LLBAA.get(cdb);
    let pc = match MODE_SENSE_PC.get(cdb) {
        0 => Pc::Current,
        1 => Pc::Changeable,
        2 => Pc::Default,
        _ => return Err(Sense::SAVING_PARAMS_NOT_SUPPORTED),
    };
    let code = PAGE_CODE.get(cdb);
    let subpage = SUBPAGE_CODE.get(cdb);
    let one = [code];
    let wanted: &[u8] = match (code, subpage) {
        (ALL_PAGES, 0x00 | 0xff) => &PAGES,
        (c, 0) if PAGES.contains(&c) => &one,
        (c, _) if PAGES.contains(&c) || c == ALL_PAGES => return Err(Sense::invalid_in_cdb(SUBPAGE_CODE)),
        _ => return Err(Sense::invalid_in_cdb(PAGE_CODE)),
    };
    let header_len = if ten { 8 } else { 4 };
    out.resize(header_len, 0);
    let devspec = if l.write_protected() { 0x80 } else { 0 } | 0x10; // WP, DPOFUA
    if ten {
        out[3] = devspec;
    } else {
        out[2] = devspec;
    }
    if !dbd {
        let blocks = l.blocks();
        if llbaa {
            out[4] = 0x01; // LONGLBA
            out[7] = 16;
            out.extend_from_slice(&blocks.to_be_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&512u32.to_be_bytes());
        } else {
            if ten {
                out[7] = 8;
            } else {
                out[3] = 8;
            }
            out.extend_from_slice(&u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(&[0, 0, 0x02, 0x00]); // block length 512
        }
    }
    for &c in wanted {
        out.extend_from_slice(&page(l, c, pc));
    }
    if ten {
        let len = (out.len() - 2) as u16;
        out[0..2].copy_from_slice(&len.to_be_bytes());
    } else {
        out[0] = (out.len() - 1).min(255) as u8;
    }
    Ok(())
}

/// Parameter list length of MODE SELECT (6)/(10).
pub fn select_len(cdb: &[u8], ten: bool) -> usize {
    if ten {
        MODE_SELECT_10_LENGTH.get(cdb) as usize
    } else {
        MODE_SELECT_6_LENGTH.get(cdb) as usize
    }
}

/// MODE SELECT (6) and (10): accept pages whose only changes are to
/// changeable bits, then apply them.
pub fn mode_select(l: &Lun, cdb: &[u8], ten: bool, params: &[u8]) -> Result<(), Sense> {
    let pf = MODE_SELECT_PF.get(cdb);
    let sp = MODE_SELECT_SP.get(cdb);
    let len = select_len(cdb, ten);
    if sp {
        return Err(Sense::invalid_in_cdb(MODE_SELECT_SP));
    }
    if len == 0 {
        return Ok(());
    }
    if !pf {
        return Err(Sense::invalid_in_cdb(MODE_SELECT_PF));
    }
    if params.len() < len {
        return Err(Sense::PARAM_LIST_LENGTH_ERROR);
    }
    let p = &params[..len];
    let header_len = if ten { 8 } else { 4 };
    if p.len() < header_len {
        return Err(Sense::PARAM_LIST_LENGTH_ERROR);
    }
    let (bd_len, long) = if ten { (be16(p, 6) as usize, p[4] & 0x01 != 0) } else { (p[3] as usize, false) };
    let bd_size = if long { 16 } else { 8 };
    if bd_len % bd_size != 0 || bd_len > bd_size {
        return Err(Sense::invalid_param_field(if ten { 6 } else { 3 }, None));
    }
    if p.len() < header_len + bd_len {
        return Err(Sense::PARAM_LIST_LENGTH_ERROR);
    }
    if bd_len > 0 {
        let bd = &p[header_len..header_len + bd_len];
        let block_len = if long { u32::from_be_bytes([bd[12], bd[13], bd[14], bd[15]]) } else { be24(bd, 5) };
        if block_len != 512 {
            return Err(Sense::invalid_param_field((header_len + bd_len - 1) as u16, None));
        }
    }
    // Validate every page before applying any.
    let mut pos = header_len + bd_len;
    let mut new_wce = None;
    let mut new_swp = None;
    while pos < p.len() {
        if p.len() < pos + 2 {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR);
        }
        let code = p[pos] & 0x3f;
        if p[pos] & 0x40 != 0 || !PAGES.contains(&code) {
            return Err(Sense::invalid_param_field(pos as u16, None));
        }
        let current = page(l, code, Pc::Current);
        let changeable = page(l, code, Pc::Changeable);
        if p[pos + 1] as usize != current.len() - 2 {
            return Err(Sense::invalid_param_field(pos as u16 + 1, None));
        }
        if p.len() < pos + current.len() {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR);
        }
        let given = &p[pos..pos + current.len()];
        for i in 2..current.len() {
            if (given[i] ^ current[i]) & !changeable[i] != 0 {
                return Err(Sense::invalid_param_field((pos + i) as u16, None));
            }
        }
        match code {
            PAGE_CACHING => new_wce = Some(given[2] & 0x04 != 0),
            PAGE_CONTROL => new_swp = Some(given[4] & 0x08 != 0),
            _ => {}
        }
        pos += current.len();
    }
    if let Some(w) = new_wce {
        l.wce.store(w, Relaxed);
    }
    if let Some(s) = new_swp {
        l.swp.store(s, Relaxed);
    }
    Ok(())
}
