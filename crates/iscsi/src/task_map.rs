//! The target session's tasks by ITT: a hash map with the task inserted
//! last held beside it.
//!
//! A 4 KiB write with immediate data is inserted when its command arrives
//! and removed when its status is sent, and a transport that runs it inline
//! does both in the same receive, with no other task added between: the
//! map's hashing, probing and moves were ~300 instructions of the ~3.3k a
//! write cost the target besides its data copy
//! (docs/notes/2026-11-27-h51r-target-writes.md). Holding the newest task
//! outside the map makes that pair two moves into and out of one slot. It
//! changes no behaviour: the held task is in the map for every lookup,
//! count and iteration (task management sees it as any other).

use std::collections::HashMap;

/// The initiator picks the keys, but the CmdSN window bounds how many there
/// are, so a fast hash is enough (with a random seed per map all the same).
type Map<T> = HashMap<u32, T, foldhash::fast::RandomState>;

/// Tasks by ITT (see the module's documentation).
#[derive(Debug)]
pub struct TaskMap<T> {
    /// The task inserted last, unless it was removed or another was
    /// inserted after it (then it moved into `rest`). Never also in `rest`.
    last: Option<(u32, T)>,
    rest: Map<T>,
}

impl<T> Default for TaskMap<T> {
    fn default() -> Self {
        TaskMap { last: None, rest: Map::default() }
    }
}

impl<T> TaskMap<T> {
    pub fn len(&self) -> usize {
        self.rest.len() + usize::from(self.last.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Insert `v` under `k`, replacing the task that had the key. Inlined
    /// so that the caller's task can be built where it is stored, not moved
    /// in (each move of a task is a memcpy call).
    #[inline]
    pub fn insert(&mut self, k: u32, v: T) {
        // Only a full slot is taken out: `take` of an empty one still
        // copies all of it (a memcpy call per command).
        if self.last.is_some() {
            if let Some((lk, lv)) = self.last.take() {
                if lk != k {
                    self.rest.insert(lk, lv);
                }
            }
        }
        if !self.rest.is_empty() {
            self.rest.remove(&k);
        }
        self.last = Some((k, v));
    }

    pub fn get(&self, k: &u32) -> Option<&T> {
        match &self.last {
            Some((lk, v)) if lk == k => Some(v),
            _ if self.rest.is_empty() => None,
            _ => self.rest.get(k),
        }
    }

    pub fn get_mut(&mut self, k: &u32) -> Option<&mut T> {
        match &mut self.last {
            Some((lk, v)) if lk == k => Some(v),
            _ if self.rest.is_empty() => None,
            _ => self.rest.get_mut(k),
        }
    }

    pub fn contains_key(&self, k: &u32) -> bool {
        self.get(k).is_some()
    }

    pub fn remove(&mut self, k: &u32) -> Option<T> {
        if self.last.as_ref().is_some_and(|(lk, _)| lk == k) {
            return self.last.take().map(|(_, v)| v);
        }
        if self.rest.is_empty() {
            return None;
        }
        self.rest.remove(k)
    }

    /// Remove `k`'s task if `f` says so (returns `Some`), dropping it where
    /// it is instead of moving it out as [`TaskMap::remove`] does: what a
    /// completion needs of a task is a few fields, and each move of a
    /// whole task is a memcpy call.
    pub fn remove_with<R>(&mut self, k: &u32, f: impl FnOnce(&T) -> Option<R>) -> Option<R> {
        if let Some((lk, v)) = &self.last {
            if lk == k {
                let r = f(v)?;
                self.last = None;
                return Some(r);
            }
        }
        if self.rest.is_empty() {
            return None;
        }
        let r = f(self.rest.get(k)?)?;
        self.rest.remove(k);
        Some(r)
    }

    /// Every task with its ITT, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&u32, &T)> {
        self.last.iter().map(|(k, v)| (k, v)).chain(self.rest.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The map answers as a plain map would through any sequence of
    /// inserts (new and replacing keys) and removes, the held task included.
    #[test]
    fn answers_as_a_plain_map() {
        let mut m = TaskMap::default();
        let mut want = BTreeMap::new();
        // A small key range so that keys are reused, replaced and removed
        // while held and while in the map.
        let mut x = 7u32;
        for step in 0..2000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let k = (x >> 16) % 6;
            if (x >> 8).is_multiple_of(3) {
                assert_eq!(m.remove(&k), want.remove(&k), "step {step}: remove {k}");
            } else if (x >> 8) % 5 == 1 {
                // remove_with, refused for odd values (left in place).
                let taken = m.remove_with(&k, |v| (v % 2 == 0).then_some(*v + 1));
                let expect = want.get(&k).filter(|v| *v % 2 == 0).map(|v| v + 1);
                if expect.is_some() {
                    want.remove(&k);
                }
                assert_eq!(taken, expect, "step {step}: remove_with {k}");
            } else {
                m.insert(k, step);
                want.insert(k, step);
            }
            assert_eq!(m.len(), want.len(), "step {step}");
            for k in 0..6 {
                assert_eq!(m.get(&k), want.get(&k), "step {step}: get {k}");
                assert_eq!(m.contains_key(&k), want.contains_key(&k));
            }
            let mut all: Vec<(u32, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
            all.sort();
            assert_eq!(all, want.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(), "step {step}: iter");
        }
    }

    #[test]
    fn the_held_task_is_changed_in_place() {
        let mut m = TaskMap::default();
        m.insert(1, 10);
        m.insert(2, 20);
        *m.get_mut(&2).unwrap() += 1;
        *m.get_mut(&1).unwrap() += 1;
        assert_eq!((m.get(&1), m.get(&2)), (Some(&11), Some(&21)));
        assert_eq!(m.values().sum::<i32>(), 32);
    }
}
