//! Reservations: SPC-2 RESERVE(6)/RELEASE(6) and SPC-4 persistent
//! reservations (PERSISTENT RESERVE IN/OUT), one state per logical unit.
//!
//! Registrations are held per I_T nexus as the transport identifies it. The
//! access check runs on every command, so it first reads an atomic flag that
//! is only set while some reservation exists.

use crate::cdb::{be32, be64};
use crate::commands::Conflict;
use crate::sense::Sense;
use crate::ua::UnitAttentions;
use crate::NexusId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Persistent reservation types (SPC-4 table 169).
#[allow(dead_code)] // the named constants document the numbers and serve the tests
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 6;
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 7;
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 8;

    pub fn valid(t: u8) -> bool {
        matches!(t, 1 | 3 | 5 | 6 | 7 | 8)
    }
    pub fn all_registrants(t: u8) -> bool {
        matches!(t, 7 | 8)
    }
    pub fn registrants_only_or_all(t: u8) -> bool {
        matches!(t, 5..=8)
    }
    pub fn exclusive_access(t: u8) -> bool {
        matches!(t, 3 | 6 | 8)
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

#[derive(Default)]
pub struct Reservations {
    /// True while a RESERVE(6) or a persistent reservation is held.
    held: AtomicBool,
    inner: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Holder of the SPC-2 RESERVE(6) reservation.
    spc2: Option<NexusId>,
    generation: u32,
    /// Registered (nexus, key) pairs in registration order.
    registrants: Vec<(NexusId, u64)>,
    /// Persistent reservation: (holder, type). For all-registrants types the
    /// holder is whoever reserved, but every registrant counts as holder.
    reservation: Option<(NexusId, u8)>,
}

impl State {
    fn key_of(&self, nexus: NexusId) -> Option<u64> {
        self.registrants.iter().find(|(n, _)| *n == nexus).map(|(_, k)| *k)
    }
    fn is_holder(&self, nexus: NexusId) -> bool {
        match self.reservation {
            Some((_, t)) if pr_type::all_registrants(t) => self.key_of(nexus).is_some(),
            Some((h, _)) => h == nexus,
            None => false,
        }
    }
    fn unregister(&mut self, nexus: NexusId, ua: &UnitAttentions) {
        self.registrants.retain(|(n, _)| *n != nexus);
        if let Some((h, t)) = self.reservation {
            let release = if pr_type::all_registrants(t) { self.registrants.is_empty() } else { h == nexus };
            if release {
                self.reservation = None;
                if pr_type::registrants_only_or_all(t) && !pr_type::all_registrants(t) {
                    // SPC-4 5.12.11.2.2: registrants-only reservation lost its holder.
                    for (n, _) in &self.registrants {
                        ua.raise_for(*n, Sense::RESERVATIONS_RELEASED);
                    }
                }
            }
        }
    }
}

impl Reservations {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_flag(&self, s: &State) {
        self.held.store(s.spc2.is_some() || s.reservation.is_some(), Ordering::Release);
    }

    /// Whether any reservation is held (cheap pre-check).
    #[inline]
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Whether `nexus` (an initiator port identity) holds a registration.
    pub fn is_registered(&self, nexus: NexusId) -> bool {
        self.lock().key_of(nexus).is_some()
    }

    /// Add every registered initiator port to `into`.
    pub fn registered_into(&self, into: &mut std::collections::HashSet<NexusId>) {
        into.extend(self.lock().registrants.iter().map(|(n, _)| *n));
    }

    /// Whether `nexus` may run a command of class `conflict` now (the
    /// class comes from the command's row, see [`Conflict`]).
    pub fn check(&self, nexus: NexusId, conflict: Conflict) -> Result<(), Denied> {
        if !self.held.load(Ordering::Acquire) {
            return Ok(());
        }
        if matches!(conflict, Conflict::Never | Conflict::Own) {
            return Ok(());
        }
        let s = self.lock();
        if let Some(holder) = s.spc2 {
            return if holder == nexus { Ok(()) } else { Err(Denied::Conflict) };
        }
        let Some((holder, t)) = s.reservation else { return Ok(()) };
        let registered = s.key_of(nexus).is_some();
        let full_access = holder == nexus || (pr_type::registrants_only_or_all(t) && registered);
        if full_access || (!pr_type::exclusive_access(t) && matches!(conflict, Conflict::Read)) {
            Ok(())
        } else {
            Err(Denied::Conflict)
        }
    }

    /// RESERVE(6): the whole logical unit for this nexus.
    pub fn reserve6(&self, nexus: NexusId) -> Result<(), Denied> {
        let mut s = self.lock();
        if !s.registrants.is_empty() || s.reservation.is_some() {
            return Err(Denied::Conflict); // SPC-4 5.12.3: PR in effect
        }
        match s.spc2 {
            Some(h) if h != nexus => Err(Denied::Conflict),
            _ => {
                s.spc2 = Some(nexus);
                self.update_flag(&s);
                Ok(())
            }
        }
    }

    /// RELEASE(6): drops this nexus's reservation; a no-op for anyone else.
    pub fn release6(&self, nexus: NexusId) -> Result<(), Denied> {
        let mut s = self.lock();
        if s.reservation.is_some() {
            return Err(Denied::Conflict);
        }
        if s.spc2 == Some(nexus) {
            s.spc2 = None;
            self.update_flag(&s);
        }
        Ok(())
    }

    /// LUN reset / nexus loss: RESERVE(6) does not survive either.
    pub fn clear_spc2(&self, only: Option<NexusId>) {
        let mut s = self.lock();
        if only.is_none() || s.spc2 == only {
            s.spc2 = None;
            self.update_flag(&s);
        }
    }

    /// PERSISTENT RESERVE IN.
    pub fn pr_in(&self, cdb: &[u8], names: &dyn Fn(NexusId) -> String, out: &mut Vec<u8>) -> Result<(), Sense> {
        let s = self.lock();
        match cdb[1] & 0x1f {
            0 => {
                // READ KEYS
                out.extend_from_slice(&s.generation.to_be_bytes());
                out.extend_from_slice(&((s.registrants.len() * 8) as u32).to_be_bytes());
                for (_, k) in &s.registrants {
                    out.extend_from_slice(&k.to_be_bytes());
                }
            }
            1 => {
                // READ RESERVATION
                out.extend_from_slice(&s.generation.to_be_bytes());
                match s.reservation {
                    Some((h, t)) => {
                        out.extend_from_slice(&16u32.to_be_bytes());
                        let key = if pr_type::all_registrants(t) { 0 } else { s.key_of(h).unwrap_or(0) };
                        out.extend_from_slice(&key.to_be_bytes());
                        out.extend_from_slice(&[0, 0, 0, 0, 0, t & 0x0f, 0, 0]);
                    }
                    None => out.extend_from_slice(&0u32.to_be_bytes()),
                }
            }
            2 => {
                // REPORT CAPABILITIES: CRH; no SIP_C/ATP_C/PTPL_C; type mask valid.
                out.extend_from_slice(&[0x00, 0x08, 0x10, 0x80]);
                out.extend_from_slice(&[0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
            }
            3 => {
                // READ FULL STATUS
                out.extend_from_slice(&s.generation.to_be_bytes());
                out.extend_from_slice(&[0; 4]);
                for (n, k) in &s.registrants {
                    let holder = s.is_holder(*n);
                    out.extend_from_slice(&k.to_be_bytes());
                    out.extend_from_slice(&[0; 4]);
                    out.push(if holder { 0x01 } else { 0 });
                    out.push(match s.reservation {
                        Some((_, t)) if holder => t & 0x0f,
                        _ => 0,
                    });
                    out.extend_from_slice(&[0; 4]);
                    out.extend_from_slice(&1u16.to_be_bytes()); // relative target port 1
                    let tid = iscsi_transport_id(&names(*n));
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

    /// PERSISTENT RESERVE OUT with its parameter list.
    pub fn pr_out(&self, nexus: NexusId, cdb: &[u8], params: &[u8], ua: &UnitAttentions) -> Result<(), Denied> {
        let req = PrOut::parse(cdb, params)?;
        let mut s = self.lock();
        if s.spc2.is_some_and(|h| h != nexus) {
            return Err(Denied::Conflict);
        }
        let mine = s.key_of(nexus);
        if req.action == pr_out_action::REGISTER {
            match mine {
                None if req.key != 0 => return Err(Denied::Conflict),
                Some(k) if k != req.key => return Err(Denied::Conflict),
                _ => {}
            }
        }
        if req.action == pr_out_action::REGISTER || req.action == pr_out_action::REGISTER_AND_IGNORE {
            s.register(nexus, mine, req.sa_key, ua);
        } else {
            // Every other action is the work of a registrant, by its key.
            if mine != Some(req.key) {
                return Err(Denied::Conflict);
            }
            match req.action {
                pr_out_action::RESERVE => s.reserve(nexus, req.ptype)?,
                pr_out_action::RELEASE => s.release(nexus, req.ptype, ua)?,
                pr_out_action::CLEAR => s.clear(nexus, ua),
                pr_out_action::PREEMPT => s.preempt(nexus, req.ptype, req.sa_key, ua)?,
                _ => unreachable!("checked by PrOut::parse"),
            }
        }
        self.update_flag(&s);
        Ok(())
    }
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
        if flags & 0x01 != 0 {
            return Err(Sense::invalid_param_field(20, Some(0)).into()); // APTPL
        }
        if matches!(action, RESERVE | RELEASE | PREEMPT) {
            if scope != 0 {
                return Err(Sense::invalid_cdb_field(2, Some(4)).into());
            }
            if !pr_type::valid(ptype) {
                return Err(Sense::invalid_cdb_field(2, Some(0)).into());
            }
        }
        Ok(PrOut { action, ptype, key, sa_key })
    }
}

/// The PERSISTENT RESERVE OUT service actions, on the locked state; the
/// caller has checked the registrant's key.
impl State {
    /// REGISTER / REGISTER AND IGNORE EXISTING KEY: register, change or
    /// (with a zero key) remove `nexus`'s key.
    fn register(&mut self, nexus: NexusId, mine: Option<u64>, sa_key: u64, ua: &UnitAttentions) {
        match (mine, sa_key) {
            (None, 0) => return,
            (None, k) => self.registrants.push((nexus, k)),
            (Some(_), 0) => self.unregister(nexus, ua),
            (Some(_), k) => {
                if let Some(r) = self.registrants.iter_mut().find(|(n, _)| *n == nexus) {
                    r.1 = k;
                }
            }
        }
        self.generation = self.generation.wrapping_add(1);
    }

    fn reserve(&mut self, nexus: NexusId, ptype: u8) -> Result<(), Denied> {
        match self.reservation {
            None => self.reservation = Some((nexus, ptype)),
            Some((_, t)) if self.is_holder(nexus) && t == ptype => {}
            Some(_) => return Err(Denied::Conflict),
        }
        Ok(())
    }

    /// Releasing a reservation one does not hold succeeds and does nothing.
    fn release(&mut self, nexus: NexusId, ptype: u8, ua: &UnitAttentions) -> Result<(), Denied> {
        if let Some((_, t)) = self.reservation {
            if self.is_holder(nexus) {
                if t != ptype {
                    return Err(Sense::INVALID_RELEASE_OF_PR.into());
                }
                self.reservation = None;
                if pr_type::registrants_only_or_all(t) {
                    for (n, _) in self.registrants.iter().filter(|(n, _)| *n != nexus) {
                        ua.raise_for(*n, Sense::RESERVATIONS_RELEASED);
                    }
                }
            }
        }
        Ok(())
    }

    fn clear(&mut self, nexus: NexusId, ua: &UnitAttentions) {
        for (n, _) in self.registrants.iter().filter(|(n, _)| *n != nexus) {
            ua.raise_for(*n, Sense::RESERVATIONS_PREEMPTED);
        }
        self.registrants.clear();
        self.reservation = None;
        self.generation = self.generation.wrapping_add(1);
    }

    /// PREEMPT: remove the registrations with `sa_key` (all others' when
    /// `sa_key` is 0 under an all-registrants reservation) and take the
    /// reservation when it was theirs.
    fn preempt(&mut self, nexus: NexusId, ptype: u8, sa_key: u64, ua: &UnitAttentions) -> Result<(), Denied> {
        match self.reservation {
            Some((_, t)) if pr_type::all_registrants(t) => {
                if sa_key == 0 {
                    self.preempt_registrations(nexus, None, ua);
                    self.reservation = Some((nexus, ptype));
                } else if self.preempt_registrations(nexus, Some(sa_key), ua) == 0 {
                    return Err(Denied::Conflict);
                }
            }
            Some((holder, _)) if self.key_of(holder) == Some(sa_key) => {
                self.preempt_registrations(nexus, Some(sa_key), ua);
                self.reservation = Some((nexus, ptype));
            }
            _ => {
                if sa_key == 0 {
                    return Err(Sense::invalid_param_field(8, None).into());
                }
                if self.preempt_registrations(nexus, Some(sa_key), ua) == 0 {
                    return Err(Denied::Conflict);
                }
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Remove every other nexus's registration (with key `only_key`, if
    /// given), telling each; how many were removed.
    fn preempt_registrations(&mut self, nexus: NexusId, only_key: Option<u64>, ua: &UnitAttentions) -> usize {
        let victims: Vec<NexusId> = self
            .registrants
            .iter()
            .filter(|(n, k)| *n != nexus && !matches!(only_key, Some(ok) if *k != ok))
            .map(|(n, _)| *n)
            .collect();
        for v in &victims {
            ua.raise_for(*v, Sense::REGISTRATIONS_PREEMPTED);
        }
        self.registrants.retain(|(n, _)| !victims.contains(n));
        victims.len()
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
