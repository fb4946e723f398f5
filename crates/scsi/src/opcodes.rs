//! REPORT SUPPORTED OPERATION CODES and REPORT SUPPORTED TASK MANAGEMENT
//! FUNCTIONS. The operation codes, service actions and CDB usage data are
//! the rows of [`crate::commands::COMMANDS`], which the table's row for
//! REPORT SUPPORTED OPERATION CODES passes in ([`Supported`]): the command
//! lists the table it is in.

use crate::cdb::field::*;
use crate::sense::Sense;

/// One supported command as REPORT SUPPORTED OPERATION CODES lists it.
#[derive(Debug, Clone, Copy)]
pub struct Supported {
    pub opcode: u8,
    pub service_action: Option<u8>,
    /// The CDB usage data (its length is the CDB's).
    pub usage: &'static [u8],
}

/// Nominal/recommended timeouts in the RCTD descriptor (seconds; 0 = unknown).
const TIMEOUT_SECS: u32 = 30;

fn timeouts_descriptor(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0x00, 0x0a, 0, 0]);
    out.extend_from_slice(&TIMEOUT_SECS.to_be_bytes());
    out.extend_from_slice(&TIMEOUT_SECS.to_be_bytes());
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN / 0x0C) of the
/// commands `supported` lists, in table order.
pub fn report_supported_opcodes(cdb: &[u8], supported: impl Iterator<Item = Supported> + Clone, out: &mut Vec<u8>) -> Result<(), Sense> {
    let rctd = RSOC_RCTD.get(cdb);
    let options = RSOC_REPORTING_OPTIONS.get(cdb);
    let req_op = RSOC_REQUESTED_OPCODE.get(cdb);
    let req_sa = RSOC_REQUESTED_SERVICE_ACTION.get(cdb);
    match options {
        0 => {
            out.extend_from_slice(&[0; 4]);
            for info in supported {
                let sa = info.service_action.unwrap_or(0) as u16;
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
            let with_sa = supported.clone().any(|s| s.opcode == req_op && s.service_action.is_some());
            if (options == 1 && with_sa) || (options == 2 && !with_sa) {
                return Err(Sense::invalid_in_cdb(RSOC_REPORTING_OPTIONS));
            }
            let found = supported
                .clone()
                .find(|i| i.opcode == req_op && (!with_sa || i.service_action.map(u16::from) == Some(req_sa)));
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
        _ => return Err(Sense::invalid_in_cdb(RSOC_REPORTING_OPTIONS)),
    }
    Ok(())
}

/// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (MAINTENANCE IN / 0x0D): abort
/// task, abort task set, clear task set, LUN reset, I_T nexus reset, target
/// reset — what an iSCSI transport offers at ERL 0.
pub fn report_supported_tmf(cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    let repd = RSTMF_REPD.get(cdb);
    // byte 0: ATS 0x80, ATSS 0x40, CACAS 0x20, CTSS 0x10, LURS 0x08, QTS 0x04, TRS 0x02 (target reset), WAKES 0x01
    // byte 1: QAES 0x04, QTSS 0x02, ITNRS 0x01
    if repd {
        out.extend_from_slice(&[0xda, 0x01, 0, 0x0c]);
        out.extend_from_slice(&[0; 12]);
    } else {
        out.extend_from_slice(&[0xda, 0x01, 0, 0]);
    }
    Ok(())
}
