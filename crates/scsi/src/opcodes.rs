//! The supported-command table: drives REPORT SUPPORTED OPERATION CODES and
//! REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.

use crate::cdb::{be16, be32, op, truncate_to};
use crate::sense::Sense;

/// One supported command: opcode, service action (if the opcode has them),
/// and the CDB usage map (which bits of each CDB byte this disk looks at).
pub struct OpInfo {
    pub opcode: u8,
    pub service_action: Option<u16>,
    pub usage: &'static [u8],
}

const fn o(opcode: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo { opcode, service_action: None, usage }
}
const fn sa(opcode: u8, service_action: u16, usage: &'static [u8]) -> OpInfo {
    OpInfo { opcode, service_action: Some(service_action), usage }
}

// Control byte: NACA and LINK are checked (and refused), hence 0x05.
pub static SUPPORTED: &[OpInfo] = &[
    o(op::TEST_UNIT_READY, &[0x00, 0, 0, 0, 0, 0x05]),
    o(op::REQUEST_SENSE, &[0x03, 0x01, 0, 0, 0xff, 0x05]),
    o(op::READ_6, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0x05]),
    o(op::WRITE_6, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0x05]),
    o(op::INQUIRY, &[0x12, 0x01, 0xff, 0xff, 0xff, 0x05]),
    o(op::MODE_SELECT_6, &[0x15, 0x11, 0, 0, 0xff, 0x05]),
    o(op::RESERVE_6, &[0x16, 0, 0, 0, 0, 0x05]),
    o(op::RELEASE_6, &[0x17, 0, 0, 0, 0, 0x05]),
    o(op::MODE_SENSE_6, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0x05]),
    o(op::START_STOP_UNIT, &[0x1b, 0x01, 0, 0x0f, 0xf7, 0x05]),
    o(op::PREVENT_ALLOW, &[0x1e, 0, 0, 0, 0x03, 0x05]),
    o(op::READ_CAPACITY_10, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0x05]),
    o(op::READ_10, &[0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::WRITE_10, &[0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::WRITE_VERIFY_10, &[0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::VERIFY_10, &[0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::PRE_FETCH_10, &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::SYNC_CACHE_10, &[0x35, 0x02, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::WRITE_SAME_10, &[0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0x05]),
    o(op::UNMAP, &[0x42, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    o(op::MODE_SELECT_10, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    o(op::MODE_SENSE_10, &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0x05]),
    sa(op::PR_IN, 0x00, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    sa(op::PR_IN, 0x01, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    sa(op::PR_IN, 0x02, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    sa(op::PR_IN, 0x03, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x00, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x01, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x02, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x03, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x04, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    sa(op::PR_OUT, 0x06, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x05]),
    o(op::READ_16, &[0x88, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::COMPARE_AND_WRITE, &[0x89, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0, 0x05]),
    o(op::WRITE_16, &[0x8a, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::WRITE_VERIFY_16, &[0x8e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::VERIFY_16, &[0x8f, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::PRE_FETCH_16, &[0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::SYNC_CACHE_16, &[0x91, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::WRITE_SAME_16, &[0x93, 0x09, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    sa(
        op::SERVICE_ACTION_IN_16,
        op::SAI_READ_CAPACITY_16 as u16,
        &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05],
    ),
    o(op::REPORT_LUNS, &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    sa(
        op::MAINTENANCE_IN,
        op::MI_REPORT_SUPPORTED_OPCODES as u16,
        &[0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05],
    ),
    sa(
        op::MAINTENANCE_IN,
        op::MI_REPORT_SUPPORTED_TMF as u16,
        &[0xa3, 0x0d, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0x05],
    ),
    o(op::READ_12, &[0xa8, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::WRITE_12, &[0xaa, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::WRITE_VERIFY_12, &[0xae, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
    o(op::VERIFY_12, &[0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0x05]),
];

/// Whether `opcode` is one whose commands are told apart by a service action.
pub fn has_service_actions(opcode: u8) -> bool {
    SUPPORTED.iter().any(|i| i.opcode == opcode && i.service_action.is_some())
}

/// Nominal/recommended timeouts in the RCTD descriptor (seconds; 0 = unknown).
const TIMEOUT_SECS: u32 = 30;

fn timeouts_descriptor(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0x00, 0x0a, 0, 0]);
    out.extend_from_slice(&TIMEOUT_SECS.to_be_bytes());
    out.extend_from_slice(&TIMEOUT_SECS.to_be_bytes());
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN / 0x0C).
pub fn report_supported_opcodes(cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = be16(cdb, 4);
    let alloc = be32(cdb, 6) as usize;
    match options {
        0 => {
            out.extend_from_slice(&[0; 4]);
            for info in SUPPORTED {
                let sa = info.service_action.unwrap_or(0);
                out.push(info.opcode);
                out.push(0);
                out.extend_from_slice(&sa.to_be_bytes());
                out.push(0);
                out.push(if info.service_action.is_some() { 0x01 } else { 0 } | if rctd { 0x02 } else { 0 });
                out.extend_from_slice(&(info.usage.len() as u16).to_be_bytes());
                if rctd {
                    timeouts_descriptor(out);
                }
            }
            let len = (out.len() - 4) as u32;
            out[0..4].copy_from_slice(&len.to_be_bytes());
        }
        1..=3 => {
            // 1: by opcode (must not have service actions); 2: by opcode +
            // service action (must have them); 3: either.
            let with_sa = has_service_actions(req_op);
            if (options == 1 && with_sa) || (options == 2 && !with_sa && is_known_opcode(req_op)) {
                return Err(Sense::invalid_cdb_field(2, Some(0)));
            }
            if options == 2 && !with_sa {
                return Err(Sense::invalid_cdb_field(2, Some(0)));
            }
            let found = SUPPORTED
                .iter()
                .find(|i| i.opcode == req_op && (!with_sa || i.service_action == Some(req_sa)));
            out.extend_from_slice(&[0, 0, 0, 0]);
            match found {
                Some(info) => {
                    out[1] = 0x03 | if rctd { 0x80 } else { 0 }; // SUPPORT: supported per standard
                    out[2..4].copy_from_slice(&(info.usage.len() as u16).to_be_bytes());
                    out.extend_from_slice(info.usage);
                    if rctd {
                        timeouts_descriptor(out);
                    }
                }
                None => out[1] = 0x01, // not supported
            }
        }
        _ => return Err(Sense::invalid_cdb_field(2, Some(0))),
    }
    truncate_to(out, alloc);
    Ok(())
}

fn is_known_opcode(opcode: u8) -> bool {
    SUPPORTED.iter().any(|i| i.opcode == opcode)
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (MAINTENANCE IN / 0x0D): abort
/// task, abort task set, clear task set, LUN reset, I_T nexus reset, target
/// reset — what an iSCSI transport offers at ERL 0.
pub fn report_supported_tmf(cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    let repd = cdb[2] & 0x80 != 0;
    let alloc = be32(cdb, 6) as usize;
    // byte 0: ATS 0x80, ATSS 0x40, CACAS 0x20, CTSS 0x10, LURS 0x08, QTS 0x04, TRS 0x02 (target reset), WAKES 0x01
    // byte 1: QAES 0x04, QTSS 0x02, ITNRS 0x01
    if repd {
        out.extend_from_slice(&[0xda, 0x01, 0, 0x0c]);
        out.extend_from_slice(&[0; 12]);
    } else {
        out.extend_from_slice(&[0xda, 0x01, 0, 0]);
    }
    truncate_to(out, alloc);
    Ok(())
}
