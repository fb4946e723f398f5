//! Persistent reservations of one volume, whichever protocol asks and
//! whichever gateway it asks through.
//!
//! SCSI-3 persistent reservations (SPC-4 5.12) and NVMe reservations (base
//! specification 2.0, 8.19) are one model: hosts register keys; one
//! registrant (or, for the all-registrants types, every registrant) holds a
//! reservation of a type that says who may read and write; PREEMPT and
//! CLEAR remove others' registrations and tell them so. This crate keeps
//! that model once per volume:
//!
//! - [`State`]: registrations, the holder and type, the generation, APTPL,
//!   plus a short log of the notifications the last changes caused
//!   ([`Event`]), so a gateway that learns of a change made elsewhere can
//!   tell its own initiators (unit attentions, NVMe reservation log pages).
//!   Its operations are plain functions (sans-IO); the protocol crates parse
//!   their commands (`bw_scsi::reservation`, `bw_nvme::reservation`), check
//!   keys their own way and call them.
//! - [`Store`]: where the state lives so that every gateway serving the
//!   volume sees it: in memory ([`MemoryStore`], one process), in a file
//!   beside a file volume ([`FileStore`], several processes on one host), in
//!   a RADOS object beside an RBD image (`bw_block`'s rbd store, with
//!   compare-and-swap and watch/notify).
//! - [`Shared`]: one volume's reservations in one process: a cached copy
//!   that every command checks without I/O, changes made by
//!   read-modify-compare-and-swap on the store, published to the other
//!   gateways before the command that made them completes, and the
//!   notifications handed to the front-ends that listen.
//!
//! Who is who ([`Who`]): a SCSI registrant is an I_T nexus, the initiator
//! port name with the relative target port it came through
//! (`scsi:NAME@RTP`); an NVMe registrant is a host, by its Host Identifier
//! (`nvme:HOSTID`), whichever controller or gateway it uses.

mod file_store;
mod shared;

pub use file_store::FileStore;
pub use shared::{Listener, Shared};

use serde::{Deserialize, Serialize};
use std::io;
use std::sync::Mutex;

/// Reservation types, as SPC-4 table 169 numbers them. NVMe numbers the
/// same six types 1..=6 ([`nvme_type`], [`from_nvme_type`]).
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
    /// The NVMe RTYPE of an SPC type.
    pub fn nvme_type(t: u8) -> u8 {
        match t {
            1 => 1,
            3 => 2,
            5 => 3,
            6 => 4,
            7 => 5,
            8 => 6,
            _ => 0,
        }
    }
    /// The SPC type of an NVMe RTYPE (1..=6).
    pub fn from_nvme_type(t: u8) -> Option<u8> {
        match t {
            1 => Some(1),
            2 => Some(3),
            3 => Some(5),
            4 => Some(6),
            5 => Some(7),
            6 => Some(8),
            _ => None,
        }
    }
}

/// A registrant's identity: `scsi:NAME@RTP` or `nvme:HOSTID` (32 hex
/// digits). [`Who::id`] is what checks compare.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Who(String);

impl Who {
    /// An I_T nexus: the SCSI initiator port name (iSCSI:
    /// `iqn...,i,0xISID`) and the relative target port it reaches the LU
    /// through.
    pub fn scsi(port_name: &str, relative_port: u16) -> Who {
        Who(format!("scsi:{}@{relative_port}", port_name.to_ascii_lowercase()))
    }
    /// An NVMe host by its 128-bit Host Identifier.
    pub fn nvme(hostid: &[u8; 16]) -> Who {
        let hex: String = hostid.iter().map(|b| format!("{b:02x}")).collect();
        Who(format!("nvme:{hex}"))
    }
    /// A registrant as the state stores it (`Registrant::who`).
    pub fn stored(s: &str) -> Who {
        Who(s.to_string())
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn id(&self) -> u64 {
        fnv1a(self.0.as_bytes())
    }
    /// The SCSI initiator port name and relative target port, for a SCSI
    /// registrant.
    pub fn scsi_parts(&self) -> Option<(&str, u16)> {
        let rest = self.0.strip_prefix("scsi:")?;
        let (name, rtp) = rest.rsplit_once('@')?;
        Some((name, rtp.parse().ok()?))
    }
    /// The Host Identifier of an NVMe registrant.
    pub fn nvme_hostid(&self) -> Option<[u8; 16]> {
        let hex = self.0.strip_prefix("nvme:")?;
        if hex.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(id)
    }
}

fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registrant {
    pub who: String,
    pub key: u64,
    /// `Who::id` of `who` (recomputed when read back).
    #[serde(skip)]
    pub id: u64,
}

/// The reservation: who made it, and its type (SPC numbering). For the
/// all-registrants types every registrant holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub who: String,
    pub ptype: u8,
    #[serde(skip)]
    pub id: u64,
}

/// What a registrant is told when a change made by someone else affects
/// it: SCSI unit attentions (SPC-4 5.12.11), NVMe reservation notification
/// log pages (base spec 5.16.1.17, types 1..=3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// Its registration was removed by PREEMPT (SCSI: REGISTRATIONS
    /// PREEMPTED; NVMe: Registration Preempted).
    RegistrationPreempted,
    /// The reservation it had access through was released (SCSI:
    /// RESERVATIONS RELEASED; NVMe: Reservation Released).
    ReservationReleased,
    /// Its registration and the reservation were cleared (SCSI:
    /// RESERVATIONS PREEMPTED; NVMe: Reservation Preempted).
    ReservationPreempted,
}

/// A notice for one registrant, numbered by the change that caused it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub who: String,
    pub notice: Notice,
}

/// How many events the state keeps: a gateway that missed more changes
/// than this in a row (its watch was down) misses their notices; the
/// registrations themselves are never lost.
pub const EVENTS_KEPT: usize = 64;

/// One volume's reservations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Counts every stored change: caches and stores compare it.
    pub seq: u64,
    /// Which run of `seq` this is: drawn at random when a change is first
    /// stored over nothing (or over a state from before epochs), and again
    /// when `seq` would pass its maximum (only a damaged or crafted state
    /// holds it), so a cache tells a state of another run, which it
    /// adopts, from an older one of its own, which it ignores
    /// ([`Shared`]). 0: no change stored since epochs were introduced.
    #[serde(default)]
    pub epoch: u64,
    /// PRgeneration (SPC) / GEN (NVMe): counts registration changes.
    pub generation: u32,
    /// Activate Persist Through Power Loss (SPC APTPL, NVMe PTPL). The
    /// state lives with the volume whatever it says (see docs/ceph.md).
    pub aptpl: bool,
    /// In registration order.
    pub registrants: Vec<Registrant>,
    pub holder: Option<Holder>,
    /// The notices of the last changes, oldest first (at most
    /// [`EVENTS_KEPT`]).
    pub events: Vec<Event>,
}

/// Why an operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// RESERVATION CONFLICT (SCSI status 18h, NVMe status 83h).
    Conflict,
    /// Releasing a reservation of another type than the one held (SCSI:
    /// INVALID RELEASE OF PERSISTENT RESERVATION).
    WrongType,
    /// PREEMPT of key 0 without an all-registrants reservation (SCSI:
    /// INVALID FIELD IN PARAMETER LIST).
    ZeroKey,
}

/// What a command does with the medium, for the access check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl State {
    /// Decode a stored state ([`State::encode`]).
    pub fn decode(b: &[u8]) -> io::Result<State> {
        let mut s: State = serde_json::from_slice(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("reservation state: {e}")))?;
        s.fill_ids();
        Ok(s)
    }

    /// The ids a stored state leaves out (they are derived).
    pub(crate) fn fill_ids(&mut self) {
        for r in &mut self.registrants {
            r.id = fnv1a(r.who.as_bytes());
        }
        if let Some(h) = &mut self.holder {
            h.id = fnv1a(h.who.as_bytes());
        }
    }
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the state serialises")
    }

    pub fn key_of(&self, who: &Who) -> Option<u64> {
        let id = who.id();
        self.registrants.iter().find(|r| r.id == id).map(|r| r.key)
    }
    fn key_of_id(&self, id: u64) -> Option<u64> {
        self.registrants.iter().find(|r| r.id == id).map(|r| r.key)
    }
    /// Whether `who` holds the reservation (every registrant does under an
    /// all-registrants type).
    pub fn is_holder(&self, who: &Who) -> bool {
        self.is_holder_id(who.id())
    }
    fn is_holder_id(&self, id: u64) -> bool {
        match &self.holder {
            Some(h) if pr_type::all_registrants(h.ptype) => self.key_of_id(id).is_some(),
            Some(h) => h.id == id,
            None => false,
        }
    }
    /// The reservation key READ RESERVATION / Report show: the holder's, 0
    /// under an all-registrants type.
    pub fn holder_key(&self) -> u64 {
        match &self.holder {
            Some(h) if !pr_type::all_registrants(h.ptype) => self.key_of_id(h.id).unwrap_or(0),
            _ => 0,
        }
    }

    /// Whether the registrant with id `id` may run a command that `access`es
    /// the medium (SPC-4 table 62, NVMe base 2.0 figure 512: the same rules).
    pub fn allows(&self, id: u64, access: Access) -> bool {
        let Some(h) = &self.holder else { return true };
        if h.id == id || (pr_type::registrants_only_or_all(h.ptype) && self.key_of_id(id).is_some()) {
            return true;
        }
        access == Access::Read && !pr_type::exclusive_access(h.ptype)
    }

    fn notify(&mut self, who: &str, notice: Notice) {
        self.events.push(Event { seq: 0, who: who.to_string(), notice });
    }

    /// Add `who` with `key`, or change its key (`key` is not 0).
    pub fn register(&mut self, who: &Who, key: u64) {
        debug_assert!(key != 0);
        let id = who.id();
        match self.registrants.iter_mut().find(|r| r.id == id) {
            Some(r) => r.key = key,
            None => self.registrants.push(Registrant { who: who.as_str().to_string(), key, id }),
        }
        self.count_registration_change();
    }

    /// PRgeneration (SPC-4) and GEN (NVMe's Reservation Status) are each
    /// defined as "a 32-bit wrapping counter": wrapping is the spec, not an
    /// overflow.
    fn count_registration_change(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Remove `who`'s registration; a reservation it held goes with it
    /// (SPC-4 5.12.11.2.2; NVMe: the same), and under a registrants-only
    /// type the other registrants are told.
    pub fn unregister(&mut self, who: &Who) {
        let id = who.id();
        self.registrants.retain(|r| r.id != id);
        if let Some(h) = self.holder.clone() {
            let release = if pr_type::all_registrants(h.ptype) { self.registrants.is_empty() } else { h.id == id };
            if release {
                self.holder = None;
                if pr_type::registrants_only_or_all(h.ptype) && !pr_type::all_registrants(h.ptype) {
                    for w in self.others(id) {
                        self.notify(&w, Notice::ReservationReleased);
                    }
                }
            }
        }
        self.count_registration_change();
    }

    fn others(&self, id: u64) -> Vec<String> {
        self.registrants.iter().filter(|r| r.id != id).map(|r| r.who.clone()).collect()
    }

    /// RESERVE / Acquire: `who` (a registrant) takes the reservation.
    pub fn reserve(&mut self, who: &Who, ptype: u8) -> Result<(), Refusal> {
        match &self.holder {
            None => {
                self.holder = Some(Holder { who: who.as_str().to_string(), ptype, id: who.id() });
                Ok(())
            }
            Some(h) if h.ptype == ptype && self.is_holder(who) => Ok(()),
            Some(_) => Err(Refusal::Conflict),
        }
    }

    /// RELEASE: a holder ends the reservation; anyone else's release
    /// succeeds and changes nothing.
    pub fn release(&mut self, who: &Who, ptype: u8) -> Result<(), Refusal> {
        let Some(h) = self.holder.clone() else { return Ok(()) };
        if !self.is_holder(who) {
            return Ok(());
        }
        if h.ptype != ptype {
            return Err(Refusal::WrongType);
        }
        self.holder = None;
        if pr_type::registrants_only_or_all(h.ptype) {
            for w in self.others(who.id()) {
                self.notify(&w, Notice::ReservationReleased);
            }
        }
        Ok(())
    }

    /// CLEAR: every registration and the reservation go; the others are told.
    pub fn clear(&mut self, who: &Who) {
        for w in self.others(who.id()) {
            self.notify(&w, Notice::ReservationPreempted);
        }
        self.registrants.clear();
        self.holder = None;
        self.count_registration_change();
    }

    /// PREEMPT (SPC) / Acquire with Preempt (NVMe): remove the registrations
    /// with key `victim` (every other one when `victim` is 0 under an
    /// all-registrants reservation) and take the reservation when it was
    /// theirs.
    pub fn preempt(&mut self, who: &Who, ptype: u8, victim: u64) -> Result<(), Refusal> {
        let me = who.id();
        match self.holder.clone() {
            Some(h) if pr_type::all_registrants(h.ptype) => {
                if victim == 0 {
                    self.remove_others(me, None);
                    self.holder = Some(Holder { who: who.as_str().to_string(), ptype, id: me });
                } else if self.remove_others(me, Some(victim)) == 0 {
                    return Err(Refusal::Conflict);
                }
            }
            Some(h) if self.key_of_id(h.id) == Some(victim) => {
                self.remove_others(me, Some(victim));
                self.holder = Some(Holder { who: who.as_str().to_string(), ptype, id: me });
            }
            _ => {
                if victim == 0 {
                    return Err(Refusal::ZeroKey);
                }
                if self.remove_others(me, Some(victim)) == 0 {
                    return Err(Refusal::Conflict);
                }
            }
        }
        self.count_registration_change();
        Ok(())
    }

    /// Remove every registration but `me`'s (with key `only_key`, if
    /// given), telling each; how many went.
    fn remove_others(&mut self, me: u64, only_key: Option<u64>) -> usize {
        let victims: Vec<Registrant> = self
            .registrants
            .iter()
            .filter(|r| r.id != me && only_key.is_none_or(|k| r.key == k))
            .cloned()
            .collect();
        for v in &victims {
            self.notify(&v.who, Notice::RegistrationPreempted);
        }
        self.registrants.retain(|r| !victims.iter().any(|v| v.id == r.id));
        victims.len()
    }
}

/// Where one volume's state is kept. Versions are [`State::seq`]: a store
/// replaces the state only if the stored one still has the `seq` the
/// caller read (compare-and-swap), so two gateways changing it at once
/// cannot lose either change.
pub trait Store: Send + Sync {
    /// The stored state (`None`: nothing stored yet, i.e. the empty state).
    fn load(&self) -> io::Result<Option<State>>;
    /// Store `new` if the stored state's seq is still `expected`; `false`
    /// (nothing stored) if someone else changed it first.
    fn replace(&self, expected: u64, new: &State) -> io::Result<bool>;
    /// Tell every other user of the store that `new` is stored, and return
    /// once they have it (or once the ones that do not answer are given
    /// up). Stores without other users do nothing.
    fn publish(&self, _new: &State) -> io::Result<()> {
        Ok(())
    }
    /// Call `on` with every state another user publishes; `on(None)` when
    /// the store can no longer promise to hear of changes (the caller then
    /// reads the store itself until told otherwise). Stores without other
    /// users never call it.
    fn watch(&self, _on: std::sync::Arc<dyn Fn(Option<State>) + Send + Sync>) -> io::Result<()> {
        Ok(())
    }
    /// For messages: where the state is.
    fn describe(&self) -> String;
}

/// The state in this process only (RAM volumes, tests).
#[derive(Default)]
pub struct MemoryStore(Mutex<Option<State>>);

impl Store for MemoryStore {
    fn load(&self) -> io::Result<Option<State>> {
        Ok(self.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
    fn replace(&self, expected: u64, new: &State) -> io::Result<bool> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if s.as_ref().map_or(0, |s| s.seq) != expected {
            return Ok(false);
        }
        *s = Some(new.clone());
        Ok(true)
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

#[cfg(test)]
mod tests;
