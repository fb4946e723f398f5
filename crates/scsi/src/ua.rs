//! Unit attention conditions, pending per I_T nexus.
//!
//! Two kinds: *broadcast* conditions (reset, capacity change) that every
//! nexus must see once — including nexuses that log in later, which then
//! learn about the reset like after a power-on — and *targeted* ones
//! (reservations preempted, ...) queued for particular nexuses. The common
//! case is "nothing ever happened": one relaxed atomic load, no lock.

use crate::sense::Sense;
use crate::ident::NexusId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct UnitAttentions {
    /// Set once any condition has ever been raised; never cleared because a
    /// nexus we have not seen yet may still have to see a broadcast.
    active: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Broadcast conditions, each with the generation it was raised at;
    /// at most one entry per distinct (ASC, ASCQ).
    broadcasts: Vec<(u64, Sense)>,
    generation: u64,
    /// Highest broadcast generation each nexus has been told about.
    seen: HashMap<NexusId, u64>,
    targeted: HashMap<NexusId, Vec<Sense>>,
}

impl UnitAttentions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave the maps inconsistent
        // in a way that matters more than losing a unit attention.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any condition was ever raised (cheap pre-check).
    #[inline]
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Raise `sense` for every nexus (present and future). A POWER ON/RESET
    /// supersedes every older condition, as SPC-4 6.? allows.
    pub fn broadcast(&self, sense: Sense) {
        let mut g = self.lock();
        g.generation += 1;
        let gen = g.generation;
        if sense == Sense::POWER_ON_RESET {
            g.broadcasts.clear();
            g.targeted.clear();
        } else {
            g.broadcasts.retain(|(_, s)| (s.asc, s.ascq) != (sense.asc, sense.ascq));
        }
        g.broadcasts.push((gen, sense));
        self.active.store(true, Ordering::Release);
    }

    /// Queue `sense` for one nexus.
    pub fn raise_for(&self, nexus: NexusId, sense: Sense) {
        let mut g = self.lock();
        let q = g.targeted.entry(nexus).or_default();
        if !q.contains(&sense) {
            q.push(sense);
        }
        self.active.store(true, Ordering::Release);
    }

    /// Take the next pending condition for `nexus`, if any (it is then
    /// considered reported).
    pub fn take(&self, nexus: NexusId) -> Option<Sense> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut g = self.lock();
        let seen = g.seen.get(&nexus).copied().unwrap_or(0);
        if let Some(&(gen, sense)) = g.broadcasts.iter().find(|(gen, _)| *gen > seen) {
            g.seen.insert(nexus, gen);
            return Some(sense);
        }
        let q = g.targeted.get_mut(&nexus)?;
        let s = if q.is_empty() { None } else { Some(q.remove(0)) };
        if q.is_empty() {
            g.targeted.remove(&nexus);
        }
        s
    }

    /// Whether anything is pending for `nexus` without consuming it.
    #[cfg(test)]
    pub fn pending(&self, nexus: NexusId) -> bool {
        if !self.active.load(Ordering::Acquire) {
            return false;
        }
        let g = self.lock();
        let seen = g.seen.get(&nexus).copied().unwrap_or(0);
        g.broadcasts.iter().any(|(gen, _)| *gen > seen) || g.targeted.contains_key(&nexus)
    }

    /// The nexus ended: forget everything about it.
    pub fn forget(&self, nexus: NexusId) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.lock();
        g.seen.remove(&nexus);
        g.targeted.remove(&nexus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_reported_once_per_nexus_including_new_ones() {
        let ua = UnitAttentions::default();
        assert_eq!(ua.take(1), None);
        ua.broadcast(Sense::POWER_ON_RESET);
        assert_eq!(ua.take(1), Some(Sense::POWER_ON_RESET));
        assert_eq!(ua.take(1), None);
        assert_eq!(ua.take(2), Some(Sense::POWER_ON_RESET));
        ua.broadcast(Sense::CAPACITY_CHANGED);
        ua.raise_for(1, Sense::RESERVATIONS_PREEMPTED);
        assert!(ua.pending(1));
        assert_eq!(ua.take(1), Some(Sense::CAPACITY_CHANGED));
        assert_eq!(ua.take(1), Some(Sense::RESERVATIONS_PREEMPTED));
        assert_eq!(ua.take(1), None);
        assert!(!ua.pending(1));
        // A reset supersedes older conditions.
        ua.raise_for(2, Sense::RESERVATIONS_PREEMPTED);
        ua.broadcast(Sense::POWER_ON_RESET);
        assert_eq!(ua.take(2), Some(Sense::POWER_ON_RESET));
        assert_eq!(ua.take(2), None);
    }
}
