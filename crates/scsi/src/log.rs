//! LOG SENSE (SPC-4 6.6): the pages smartctl and sg_logs ask for first.
//! A software disk has no thermometer: the temperature pages report "not
//! available" (0xFF) as SPC allows, and informational exceptions report no
//! failure predicted. LOG SELECT is not implemented (nothing to reset).

use crate::cdb::field::*;
use crate::sense::Sense;

pub const SUPPORTED_PAGES: u8 = 0x00;
pub const TEMPERATURE: u8 = 0x0D;
pub const INFORMATIONAL_EXCEPTIONS: u8 = 0x2F;
const PAGES: [u8; 3] = [SUPPORTED_PAGES, TEMPERATURE, INFORMATIONAL_EXCEPTIONS];
/// SPC-4 7.3.21: a temperature of 0xFF means "not available".
const NO_TEMPERATURE: u8 = 0xFF;
/// Parameter control byte: binary list format (FORMAT AND LINKING = 11b).
const BINARY: u8 = 0x03;

/// LOG SENSE: the page and subpage asked for, from its parameter pointer
/// on (PC, page control, is not looked at: every value is current).
pub fn log_sense(cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    if LOG_SENSE_SP.get(cdb) {
        return Err(Sense::invalid_in_cdb(LOG_SENSE_SP)); // nothing is saved
    }
    let page = PAGE_CODE.get(cdb);
    let subpage = SUBPAGE_CODE.get(cdb);
    let pointer = LOG_SENSE_PARAMETER_POINTER.get(cdb);
    out.extend_from_slice(&[page, 0, 0, 0]);
    // (parameter code, value bytes) of the page, in ascending code order.
    let params: Vec<(u16, Vec<u8>)> = match (page, subpage) {
        (SUPPORTED_PAGES, 0x00) => {
            out.extend_from_slice(&PAGES);
            return finish(out);
        }
        (SUPPORTED_PAGES, 0xff) => {
            // Supported pages and subpages: (page, subpage) pairs.
            out[0] |= 0x40; // SPF
            out[1] = 0xff;
            for p in PAGES {
                out.extend_from_slice(&[p, 0x00]);
                if p == SUPPORTED_PAGES {
                    out.extend_from_slice(&[p, 0xff]);
                }
            }
            return finish(out);
        }
        // Current and reference temperature.
        (TEMPERATURE, 0x00) => vec![(0x0000, vec![0, NO_TEMPERATURE]), (0x0001, vec![0, NO_TEMPERATURE])],
        // INFORMATIONAL EXCEPTION ASC/ASCQ 0/0 (no failure predicted), most
        // recent temperature reading.
        (INFORMATIONAL_EXCEPTIONS, 0x00) => vec![(0x0000, vec![0, 0, NO_TEMPERATURE])],
        (_, 0x00) => return Err(Sense::invalid_in_cdb(PAGE_CODE)),
        _ => return Err(Sense::invalid_in_cdb(SUBPAGE_CODE)),
    };
    if params.last().is_some_and(|(code, _)| pointer > *code) {
        return Err(Sense::invalid_in_cdb(LOG_SENSE_PARAMETER_POINTER));
    }
    for (code, value) in params.iter().filter(|(code, _)| *code >= pointer) {
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(&[BINARY, value.len() as u8]);
        out.extend_from_slice(value);
    }
    finish(out)
}

fn finish(out: &mut [u8]) -> Result<(), Sense> {
    let len = (out.len() - 4) as u16;
    out[2..4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sense(cdb: [u8; 10]) -> Result<Vec<u8>, Sense> {
        let mut out = Vec::new();
        log_sense(&cdb, &mut out).map(|()| out)
    }

    #[test]
    fn supported_pages_and_subpages() {
        assert_eq!(sense([0x4d, 0, 0x40, 0, 0, 0, 0, 0, 0xff, 0]).unwrap(), vec![0, 0, 0, 3, 0x00, 0x0d, 0x2f]);
        assert_eq!(
            sense([0x4d, 0, 0x40, 0xff, 0, 0, 0, 0, 0xff, 0]).unwrap(),
            vec![0x40, 0xff, 0, 8, 0x00, 0x00, 0x00, 0xff, 0x0d, 0x00, 0x2f, 0x00]
        );
    }

    #[test]
    fn temperature_and_informational_exceptions() {
        assert_eq!(
            sense([0x4d, 0, 0x4d, 0, 0, 0, 0, 0, 0xff, 0]).unwrap(),
            vec![0x0d, 0, 0, 12, 0, 0, 3, 2, 0, 0xff, 0, 1, 3, 2, 0, 0xff]
        );
        // Parameter pointer 1: only the reference temperature.
        assert_eq!(sense([0x4d, 0, 0x4d, 0, 0, 0, 1, 0, 0xff, 0]).unwrap(), vec![0x0d, 0, 0, 6, 0, 1, 3, 2, 0, 0xff]);
        assert_eq!(sense([0x4d, 0, 0x6f, 0, 0, 0, 0, 0, 0xff, 0]).unwrap(), vec![0x2f, 0, 0, 7, 0, 0, 3, 3, 0, 0, 0xff]);
        // (The allocation length is applied by the dispatcher, from the
        // command's row: tests/commands.rs checks it for every command.)
    }

    #[test]
    fn refusals() {
        assert_eq!(sense([0x4d, 0, 0x73, 0, 0, 0, 0, 0, 0xff, 0]), Err(Sense::invalid_cdb_field(2, Some(5))));
        assert_eq!(sense([0x4d, 0, 0x4d, 0x01, 0, 0, 0, 0, 0xff, 0]), Err(Sense::invalid_cdb_field(3, None)));
        assert_eq!(sense([0x4d, 1, 0x4d, 0, 0, 0, 0, 0, 0xff, 0]), Err(Sense::invalid_cdb_field(1, Some(0))));
        assert_eq!(sense([0x4d, 0, 0x4d, 0, 0, 0, 2, 0, 0xff, 0]), Err(Sense::invalid_cdb_field(5, None)));
    }
}
