//! NVMe reservations (base specification 2.0, 8.19): Reservation Register,
//! Report, Acquire and Release, on the volume's shared reservation state
//! (`bw_reservation`), which SCSI persistent reservations over the same
//! volume and every gateway serving it share. A registrant here is a host
//! ([`Host`]: its Host Identifier), whichever controller or gateway it
//! comes through.
//!
//! Where NVMe and SPC differ and what this does (docs/ceph.md has the whole
//! mapping):
//! - Register (RREGA 0) of a host that holds another key is a conflict, of
//!   the same key a success that changes nothing; SCSI's REGISTER changes
//!   the key when the old one matches. A new key of 0 is an invalid field:
//!   0 means "no key" in the shared state (SPC's unregister).
//! - IEKEY skips the current key check, like SPC's REGISTER AND IGNORE
//!   EXISTING KEY, for Register, Acquire and Release alike.
//! - Preempt and Abort (RACQA 2) preempts; commands in flight are not
//!   aborted (they are not held back anywhere, they finish).
//! - The report names each registrant's controller as FFFFh (a dynamic
//!   controller model, as Linux nvmet does), and SCSI registrants with a
//!   Host Identifier of zeroes.
//! - CPTPL sets the state's APTPL, which SCSI's PTPL_A reports; the state
//!   lives with the volume either way.

use crate::queue_entry::Sqe;
use crate::subsystem::{Namespace, Subsystem};
use crate::nvm_commands::{Host, IoDone};
use crate::Status;
use bw_reservation::{pr_type, Refusal, State, Who};
use bytes::Bytes;

/// Identify Namespace RESCAP (byte 31): persist through power loss, the
/// six types, and IEKEY as NVMe 1.3 defines it.
pub const RESCAP: u8 = 0xFF;

/// Reservation Notification log page types (base 2.0, figure 260).
pub mod notice {
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
}

/// The log page type of a notice, and its bit in the Reservation
/// Notification Mask feature.
pub fn notice_type(n: bw_reservation::Notice) -> u8 {
    match n {
        bw_reservation::Notice::RegistrationPreempted => notice::REGISTRATION_PREEMPTED,
        bw_reservation::Notice::ReservationReleased => notice::RESERVATION_RELEASED,
        bw_reservation::Notice::ReservationPreempted => notice::RESERVATION_PREEMPTED,
    }
}

fn status_of(r: Refusal) -> Status {
    match r {
        Refusal::Conflict => Status::RESERVATION_CONFLICT.dnr(),
        Refusal::WrongType | Refusal::ZeroKey => Status::INVALID_FIELD.dnr(),
    }
}

fn done(r: std::io::Result<Result<(), Refusal>>) -> IoDone {
    match r {
        Ok(Ok(())) => IoDone { status: Status::SUCCESS, data: None },
        Ok(Err(refused)) => IoDone { status: status_of(refused), data: None },
        Err(e) => {
            log::warn!("nvme reservations: {e}");
            IoDone { status: Status::INTERNAL, data: None }
        }
    }
}

fn fail(s: Status) -> IoDone {
    IoDone { status: s, data: None }
}

fn le64(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().expect("8 bytes"))
}

/// The key check every action but Register makes: `who` is registered,
/// with `crkey` unless IEKEY.
fn key_matches(s: &State, who: &Who, crkey: u64, iekey: bool) -> Result<(), Refusal> {
    match s.key_of(who) {
        Some(k) if iekey || k == crkey => Ok(()),
        _ => Err(Refusal::Conflict),
    }
}

/// Reservation Register: CDW10 RREGA (2:0), IEKEY (3), CPTPL (31:30); data
/// CRKEY, NRKEY.
pub(crate) fn register(_: &Subsystem, ns: Option<&Namespace>, host: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let Some(ns) = ns else { return fail(Status::INVALID_NS.dnr()) };
    if data.len() < 16 {
        return fail(Status::SGL_INVALID_DATA.dnr());
    }
    let c10 = sqe.cdw(10);
    let (rrega, iekey, cptpl) = (c10 & 7, c10 & 8 != 0, c10 >> 30);
    let (crkey, nrkey) = (le64(data, 0), le64(data, 8));
    let ptpl = match cptpl {
        0 => None,
        2 => Some(false),
        3 => Some(true),
        _ => return fail(Status::INVALID_FIELD.dnr()),
    };
    if rrega > 2 || (rrega != 1 && nrkey == 0) {
        return fail(Status::INVALID_FIELD.dnr());
    }
    let who = &host.who;
    done(ns.volume.reservations().change(|s| {
        match rrega {
            0 => match s.key_of(who) {
                Some(k) if k == nrkey => {}
                Some(_) => return Err(Refusal::Conflict),
                None => s.register(who, nrkey),
            },
            1 => {
                key_matches(s, who, crkey, iekey)?;
                s.unregister(who);
            }
            _ => {
                key_matches(s, who, crkey, iekey)?;
                s.register(who, nrkey);
            }
        }
        if let Some(p) = ptpl {
            s.aptpl = p;
        }
        Ok(())
    }))
}

/// Reservation Acquire: CDW10 RACQA (2:0), IEKEY (3), RTYPE (15:8); data
/// CRKEY, PRKEY.
pub(crate) fn acquire(_: &Subsystem, ns: Option<&Namespace>, host: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let Some(ns) = ns else { return fail(Status::INVALID_NS.dnr()) };
    if data.len() < 16 {
        return fail(Status::SGL_INVALID_DATA.dnr());
    }
    let c10 = sqe.cdw(10);
    let (racqa, iekey) = (c10 & 7, c10 & 8 != 0);
    let Some(ptype) = pr_type::from_nvme_type((c10 >> 8) as u8) else { return fail(Status::INVALID_FIELD.dnr()) };
    if racqa > 2 {
        return fail(Status::INVALID_FIELD.dnr());
    }
    let (crkey, prkey) = (le64(data, 0), le64(data, 8));
    let who = &host.who;
    done(ns.volume.reservations().change(|s| {
        key_matches(s, who, crkey, iekey)?;
        match racqa {
            0 => s.reserve(who, ptype),
            // Preempt, and Preempt and Abort (nothing is held back to abort).
            _ => s.preempt(who, ptype, prkey),
        }
    }))
}

/// Reservation Release: CDW10 RRELA (2:0), IEKEY (3), RTYPE (15:8); data
/// CRKEY.
pub(crate) fn release(_: &Subsystem, ns: Option<&Namespace>, host: &Host, sqe: &Sqe, data: &[u8]) -> IoDone {
    let Some(ns) = ns else { return fail(Status::INVALID_NS.dnr()) };
    if data.len() < 8 {
        return fail(Status::SGL_INVALID_DATA.dnr());
    }
    let c10 = sqe.cdw(10);
    let (rrela, iekey, rtype) = (c10 & 7, c10 & 8 != 0, (c10 >> 8) as u8);
    if rrela > 1 {
        return fail(Status::INVALID_FIELD.dnr());
    }
    let crkey = le64(data, 0);
    let who = &host.who;
    done(ns.volume.reservations().change(|s| {
        key_matches(s, who, crkey, iekey)?;
        if rrela == 1 {
            s.clear(who);
            return Ok(());
        }
        match pr_type::from_nvme_type(rtype) {
            Some(t) => s.release(who, t),
            // Not a type: refused if this host holds the reservation (a
            // mismatch), nothing to do otherwise.
            None if s.is_holder(who) => Err(Refusal::WrongType),
            None => Ok(()),
        }
    }))
}

/// Reservation Report: CDW10 NUMD (dwords, 0's based), CDW11 EDS (bit 0).
/// Hosts on fabrics have 128-bit identifiers, so only the extended data
/// structure can name them (as Linux nvmet, a report without EDS fails).
pub(crate) fn report(_: &Subsystem, ns: Option<&Namespace>, _: &Host, sqe: &Sqe, _: &[u8]) -> IoDone {
    let Some(ns) = ns else { return fail(Status::INVALID_NS.dnr()) };
    if sqe.cdw(11) & 1 == 0 {
        return fail(Status::HOST_ID_INCONSISTENT.dnr());
    }
    // NUMD is the host's to choose (up to 16 GiB): bounded by MDTS and
    // equal to the SGL's length (as Linux nvmet checks) before anything is
    // sized by it.
    let want = ((sqe.cdw(10) as u64) + 1) * 4;
    if want > crate::limits::MAX_TRANSFER as u64 {
        return fail(Status::INVALID_FIELD.dnr());
    }
    if want != sqe.sgl().length as u64 {
        return fail(Status::SGL_INVALID_DATA.dnr());
    }
    let s = match ns.volume.reservations().read() {
        Ok(s) => s,
        Err(e) => {
            log::warn!("nvme reservations: {e}");
            return fail(Status::INTERNAL);
        }
    };
    // NUMD bytes of the page: cut there, or zero-filled past its end.
    let mut page = report_page(&s);
    page.resize(want as usize, 0);
    IoDone { status: Status::SUCCESS, data: Some(Bytes::from(page)) }
}

/// The extended Reservation Status data structure (base 2.0, figure 394):
/// a 64-byte header (GEN, RTYPE, REGCTL, PTPLS), then 64 bytes per
/// registrant (CNTLID, RCSTS, RKEY, HOSTID).
pub fn report_page(s: &State) -> Vec<u8> {
    use bw_wire::{Field, Le};
    let mut b = vec![0u8; 64 + 64 * s.registrants.len()];
    Field::<Le<u32>>::at(0).set(&mut b, s.generation);
    b[4] = s.holder.as_ref().map_or(0, |h| pr_type::nvme_type(h.ptype));
    Field::<Le<u16>>::at(5).set(&mut b, s.registrants.len() as u16);
    b[9] = s.aptpl as u8;
    for (i, r) in s.registrants.iter().enumerate() {
        let e = 64 + 64 * i;
        let who = Who::stored(&r.who);
        Field::<Le<u16>>::at(e).set(&mut b, 0xFFFF);
        b[e + 2] = s.is_holder(&who) as u8;
        Field::<Le<u64>>::at(e + 8).set(&mut b, r.key);
        b[e + 16..e + 32].copy_from_slice(&who.nvme_hostid().unwrap_or_default());
    }
    b
}

#[cfg(test)]
mod tests;
