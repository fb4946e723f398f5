//! Reservations: SPC-2 RESERVE(6)/RELEASE(6) and SPC-4 persistent
//! reservations (PERSISTENT RESERVE IN/OUT).
//!
//! Persistent reservations belong to the volume, not to this LU: they live
//! in the volume's [`bw_reservation::Shared`], which NVMe namespaces over
//! the same volume and other gateways serving it share (see that crate).
//! Here is what is SCSI about them: the CDBs and parameter lists, the key
//! checks of each service action, the PERSISTENT RESERVE IN data, the
//! unit attentions for the notices a change causes, and the I_T nexus as
//! a registrant ([`Who::scsi`]: initiator port name and relative target
//! port). SPC-2 RESERVE(6) stays in this process: it does not survive a
//! nexus loss anyway, and SPC-4 made it obsolete.
//!
//! The access check runs on every command; it first reads atomic flags that
//! are only set while some reservation exists.

use crate::cdb::{be32, be64};
use crate::sense::Sense;
use crate::ua::UnitAttentions;
use crate::ident::NexusId;
use bw_reservation::{pr_type, Access, Listener, Notice, Refusal, Shared, State, Who};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How a command stands with respect to reservations held by another
/// I_T nexus (SPC-4 5.12.1 table 62 and the SPC-2 RESERVE rules).
#[derive(Debug, Clone, Copy)]
pub enum Conflict {
    /// Never conflicts: identification, sense and capability queries.
    Never,
    /// Neither modifies the medium nor the device's state: allowed to
    /// non-holders under Write Exclusive types, conflicts under Exclusive
    /// Access.
    Read,
    /// Conflicts unless the nexus has access.
    Write,
    /// RESERVE/RELEASE and PERSISTENT RESERVE IN/OUT check for themselves.
    Own,
    /// Depends on the CDB (PREVENT ALLOW MEDIUM REMOVAL with PREVENT 0
    /// never conflicts, with PREVENT set it does).
    ByCdb(fn(&[u8]) -> Conflict),
}

impl Conflict {
    /// The class for this CDB (resolves [`Conflict::ByCdb`]).
    pub fn of(self, cdb: &[u8]) -> Conflict {
        match self {
            Conflict::ByCdb(f) => f(cdb),
            c => c,
        }
    }
}

/// Why a command may not run.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    Conflict,
    Check(Sense),
}

impl From<Sense> for Denied {
    fn from(s: Sense) -> Self {
        Denied::Check(s)
    }
}

impl From<Refusal> for Denied {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Conflict => Denied::Conflict,
            Refusal::WrongType => Denied::Check(Sense::INVALID_RELEASE_OF_PR),
            Refusal::ZeroKey => Denied::Check(Sense::invalid_param_field(8, None)),
        }
    }
}

/// The store could not be read or written: the command fails, nothing is
/// known to have changed.
fn store_failed(e: std::io::Error) -> Denied {
    log::warn!("persistent reservations: {e}");
    Denied::Check(Sense::INTERNAL_TARGET_FAILURE)
}

pub struct Reservations {
    /// True while a RESERVE(6) reservation is held.
    spc2_held: AtomicBool,
    /// Holder of the SPC-2 RESERVE(6) reservation.
    spc2: Mutex<Option<NexusId>>,
    shared: Arc<Shared>,
    /// Raises the unit attentions of the notices meant for the I_T nexuses
    /// of this LU's target port.
    _notices: Listener,
}

/// How a notice reads as a unit attention (SPC-4 5.12.11).
fn sense_of(n: Notice) -> Sense {
    match n {
        Notice::RegistrationPreempted => Sense::REGISTRATIONS_PREEMPTED,
        Notice::ReservationReleased => Sense::RESERVATIONS_RELEASED,
        Notice::ReservationPreempted => Sense::RESERVATIONS_PREEMPTED,
    }
}

/// The initiator port name given to a nexus the transport did not name.
pub(crate) fn unnamed_port(nexus: NexusId) -> String {
    format!("blockwire.nexus.{nexus}")
}

/// The unit attention identity (see `ScsiTarget::identity`) of an
/// initiator port name.
pub(crate) fn identity_of(name: &str) -> NexusId {
    match name.strip_prefix("blockwire.nexus.").and_then(|n| n.parse().ok()) {
        Some(n) => n,
        None => crate::ident::port_identity(name),
    }
}

impl Reservations {
    /// The reservations of an LU over a volume whose shared state is
    /// `shared`, reached through relative target port `relative_port`.
    pub fn new(shared: Arc<Shared>, relative_port: u16, ua: Arc<UnitAttentions>) -> Reservations {
        let notices = shared.listen(move |e| {
            let who = Who::stored(&e.who);
            if let Some((name, rtp)) = who.scsi_parts() {
                if rtp == relative_port {
                    ua.raise_for(identity_of(name), sense_of(e.notice));
                }
            }
        });
        Reservations { spc2_held: AtomicBool::new(false), spc2: Mutex::new(None), shared, _notices: notices }
    }

    fn spc2(&self) -> std::sync::MutexGuard<'_, Option<NexusId>> {
        self.spc2.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any reservation is held (cheap pre-check).
    #[inline]
    pub fn held(&self) -> bool {
        self.spc2_held.load(Ordering::Acquire) || self.shared.held()
    }

    /// Whether the initiator port `name` holds a registration through any
    /// target port.
    pub fn is_registered(&self, identity: NexusId) -> bool {
        self.shared.cached().registrants.iter().any(|r| Who::stored(&r.who).scsi_parts().map(|(n, _)| identity_of(n)) == Some(identity))
    }

    /// Add every registered initiator port's identity to `into`.
    pub fn registered_into(&self, into: &mut std::collections::HashSet<NexusId>) {
        for r in &self.shared.cached().registrants {
            if let Some((n, _)) = Who::stored(&r.who).scsi_parts() {
                into.insert(identity_of(n));
            }
        }
    }

    /// Whether nexus `nexus` (as registrant `who`) may run a command of
    /// class `conflict` now (the class comes from the command's row, see
    /// [`Conflict`]).
    pub fn check(&self, nexus: NexusId, who: &Who, conflict: Conflict) -> Result<(), Denied> {
        let access = match conflict {
            Conflict::Never | Conflict::Own => return Ok(()),
            Conflict::Read => Access::Read,
            _ => Access::Write,
        };
        if self.spc2_held.load(Ordering::Acquire) {
            if let Some(holder) = *self.spc2() {
                return if holder == nexus { Ok(()) } else { Err(Denied::Conflict) };
            }
        }
        if self.shared.allows(who.id(), access) {
            Ok(())
        } else {
            Err(Denied::Conflict)
        }
    }

    /// RESERVE(6): the whole logical unit for this nexus.
    pub fn reserve6(&self, nexus: NexusId) -> Result<(), Denied> {
        let s = self.shared.read().map_err(store_failed)?;
        let mut h = self.spc2();
        if !s.registrants.is_empty() || s.holder.is_some() {
            return Err(Denied::Conflict); // SPC-4 5.12.3: PR in effect
        }
        match *h {
            Some(x) if x != nexus => Err(Denied::Conflict),
            _ => {
                *h = Some(nexus);
                self.spc2_held.store(true, Ordering::Release);
                Ok(())
            }
        }
    }

    /// RELEASE(6): drops this nexus's reservation; a no-op for anyone else.
    pub fn release6(&self, nexus: NexusId) -> Result<(), Denied> {
        if self.shared.cached().holder.is_some() {
            return Err(Denied::Conflict);
        }
        self.clear_spc2(Some(nexus));
        Ok(())
    }

    /// LUN reset / nexus loss: RESERVE(6) does not survive either.
    pub fn clear_spc2(&self, only: Option<NexusId>) {
        let mut h = self.spc2();
        if only.is_none() || *h == only {
            *h = None;
            self.spc2_held.store(false, Ordering::Release);
        }
    }

    /// PERSISTENT RESERVE IN, from the state as the store has it now.
    pub fn pr_in(&self, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Denied> {
        let s = self.shared.read().map_err(store_failed)?;
        Ok(pr_in_data(&s, cdb, out)?)
    }

    /// PERSISTENT RESERVE OUT with its parameter list, from nexus `nexus`
    /// (registrant `who`).
    pub fn pr_out(&self, nexus: NexusId, who: &Who, cdb: &[u8], params: &[u8]) -> Result<(), Denied> {
        let req = PrOut::parse(cdb, params)?;
        if self.spc2().is_some_and(|h| h != nexus) {
            return Err(Denied::Conflict);
        }
        let r = self.shared.change(|s| req.apply(s, who)).map_err(store_failed)?;
        Ok(r?)
    }
}

/// The PERSISTENT RESERVE IN data of `s` (SPC-4 6.14).
fn pr_in_data(s: &State, cdb: &[u8], out: &mut Vec<u8>) -> Result<(), Sense> {
    match cdb[1] & 0x1f {
        0 => {
            // READ KEYS
            out.extend_from_slice(&s.generation.to_be_bytes());
            out.extend_from_slice(&((s.registrants.len() * 8) as u32).to_be_bytes());
            for r in &s.registrants {
                out.extend_from_slice(&r.key.to_be_bytes());
            }
        }
        1 => {
            // READ RESERVATION
            out.extend_from_slice(&s.generation.to_be_bytes());
            match &s.holder {
                Some(h) => {
                    out.extend_from_slice(&16u32.to_be_bytes());
                    out.extend_from_slice(&s.holder_key().to_be_bytes());
                    out.extend_from_slice(&[0, 0, 0, 0, 0, h.ptype & 0x0f, 0, 0]);
                }
                None => out.extend_from_slice(&0u32.to_be_bytes()),
            }
        }
        2 => {
            // REPORT CAPABILITIES: CRH, PTPL_C (the state lives with the
            // volume); no SIP_C/ATP_C; type mask valid, PTPL_A as set.
            out.extend_from_slice(&[0x00, 0x08, 0x10 | 0x01, 0x80 | s.aptpl as u8]);
            out.extend_from_slice(&[0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
        }
        3 => {
            // READ FULL STATUS: the SCSI registrants (an NVMe host has no
            // SCSI TransportID; READ KEYS lists its key).
            out.extend_from_slice(&s.generation.to_be_bytes());
            out.extend_from_slice(&[0; 4]);
            for r in &s.registrants {
                let who = Who::stored(&r.who);
                let Some((name, rtp)) = who.scsi_parts() else { continue };
                let holder = s.is_holder(&who);
                out.extend_from_slice(&r.key.to_be_bytes());
                out.extend_from_slice(&[0; 4]);
                out.push(if holder { 0x01 } else { 0 });
                out.push(match &s.holder {
                    Some(h) if holder => h.ptype & 0x0f,
                    _ => 0,
                });
                out.extend_from_slice(&[0; 4]);
                out.extend_from_slice(&rtp.to_be_bytes());
                let tid = iscsi_transport_id(name);
                out.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                out.extend_from_slice(&tid);
            }
            let len = (out.len() - 8) as u32;
            out[4..8].copy_from_slice(&len.to_be_bytes());
        }
        _ => return Err(Sense::invalid_cdb_field(1, Some(4))),
    }
    Ok(())
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 table 172) this target
/// implements.
mod pr_out_action {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const REGISTER_AND_IGNORE: u8 = 6;
}

/// A PERSISTENT RESERVE OUT request: its CDB and basic parameter list,
/// checked.
struct PrOut {
    action: u8,
    ptype: u8,
    key: u64,
    sa_key: u64,
    aptpl: bool,
}

impl PrOut {
    fn parse(cdb: &[u8], params: &[u8]) -> Result<PrOut, Denied> {
        use pr_out_action::*;
        let action = cdb[1] & 0x1f;
        let scope = cdb[2] >> 4;
        let ptype = cdb[2] & 0x0f;
        let list_len = be32(cdb, 5) as usize;
        if !matches!(action, REGISTER | RESERVE | RELEASE | CLEAR | PREEMPT | REGISTER_AND_IGNORE) {
            return Err(Sense::invalid_cdb_field(1, Some(4)).into());
        }
        if list_len != 24 {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR.into());
        }
        if params.len() < 24 {
            return Err(Sense::PARAM_LIST_LENGTH_ERROR.into());
        }
        let key = be64(params, 0);
        let sa_key = be64(params, 8);
        let flags = params[20];
        if flags & 0x08 != 0 {
            return Err(Sense::invalid_param_field(20, Some(3)).into()); // SPEC_I_PT
        }
        if flags & 0x04 != 0 {
            return Err(Sense::invalid_param_field(20, Some(2)).into()); // ALL_TG_PT
        }
        if matches!(action, RESERVE | RELEASE | PREEMPT) {
            if scope != 0 {
                return Err(Sense::invalid_cdb_field(2, Some(4)).into());
            }
            if !pr_type::valid(ptype) {
                return Err(Sense::invalid_cdb_field(2, Some(0)).into());
            }
        }
        Ok(PrOut { action, ptype, key, sa_key, aptpl: flags & 0x01 != 0 })
    }

    /// The service action on the shared state, with SPC's key checks.
    fn apply(&self, s: &mut State, who: &Who) -> Result<(), Refusal> {
        use pr_out_action::*;
        let mine = s.key_of(who);
        match self.action {
            REGISTER | REGISTER_AND_IGNORE => {
                if self.action == REGISTER {
                    match mine {
                        None if self.key != 0 => return Err(Refusal::Conflict),
                        Some(k) if k != self.key => return Err(Refusal::Conflict),
                        _ => {}
                    }
                }
                match (mine, self.sa_key) {
                    (None, 0) => return Ok(()),
                    (Some(_), 0) => s.unregister(who),
                    (_, k) => s.register(who, k),
                }
                // APTPL comes with each registration (SPC-4 5.12.5).
                if self.sa_key != 0 {
                    s.aptpl = self.aptpl;
                }
                Ok(())
            }
            // Every other action is the work of a registrant, by its key.
            _ if mine != Some(self.key) => Err(Refusal::Conflict),
            RESERVE => s.reserve(who, self.ptype),
            RELEASE => s.release(who, self.ptype),
            CLEAR => {
                s.clear(who);
                Ok(())
            }
            PREEMPT => s.preempt(who, self.ptype, self.sa_key),
            _ => unreachable!("checked by PrOut::parse"),
        }
    }
}

/// iSCSI TransportID, format 00b (SPC-4 7.6.4.6): the initiator name,
/// NUL-terminated and padded to a multiple of 4 bytes (at least 20 bytes).
fn iscsi_transport_id(name: &str) -> Vec<u8> {
    let mut body: Vec<u8> = name.bytes().filter(|b| *b != 0).collect();
    body.push(0);
    while body.len() & 3 != 0 || body.len() < 16 {
        body.push(0);
    }
    let mut t = vec![0x05, 0];
    t.extend_from_slice(&(body.len() as u16).to_be_bytes());
    t.extend_from_slice(&body);
    t
}
