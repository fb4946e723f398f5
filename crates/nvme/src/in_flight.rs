//! The commands one host-side queue has in flight, by command ID, for both
//! transports ([`crate::host_queue`] over TCP, [`crate::rdma_host`] over
//! RDMA): a free ID for each submission, the caller's context until the
//! caller gives up, each command's deadline, and what the transport keeps
//! per command. A command the caller gave up on keeps its ID until the
//! controller completes it, so a late completion is never taken for a
//! newer command.

use std::time::Instant;

/// One command in flight.
pub struct Entry<C, S> {
    /// None once the caller gave up on the command.
    pub ctx: Option<C>,
    pub deadline: Instant,
    /// What the transport keeps for the command.
    pub state: S,
}

pub struct InFlight<C, S> {
    slots: Vec<Option<Entry<C, S>>>,
    /// Free command IDs, the lowest last (taken first).
    free: Vec<u16>,
}

impl<C, S> InFlight<C, S> {
    /// Command IDs 0..depth.
    pub fn new(depth: usize) -> InFlight<C, S> {
        let depth = depth.min(u16::MAX as usize + 1);
        InFlight { slots: (0..depth).map(|_| None).collect(), free: (0..depth).rev().map(|i| i as u16).collect() }
    }

    /// Give a command a free ID; `Err(ctx)` when every ID is taken.
    /// Inlined so that the entry is built in its slot, not on the stack
    /// and then copied there (~130 bytes over TCP, once per command).
    #[inline]
    pub fn insert(&mut self, ctx: C, deadline: Instant, state: S) -> Result<u16, C> {
        let Some(cid) = self.free.pop() else {
            return Err(ctx);
        };
        self.slots[cid as usize] = Some(Entry { ctx: Some(ctx), deadline, state });
        Ok(cid)
    }

    pub fn get_mut(&mut self, cid: u16) -> Option<&mut Entry<C, S>> {
        self.slots.get_mut(cid as usize)?.as_mut()
    }

    /// The command is over: its entry, and its ID is free again.
    pub fn remove(&mut self, cid: u16) -> Option<Entry<C, S>> {
        let e = self.slots.get_mut(cid as usize)?.take()?;
        self.free.push(cid);
        Some(e)
    }

    /// The command is over: `f` takes what it needs from the entry where
    /// it lies, then the entry is dropped and its ID is free again. A
    /// completion comes once per I/O, and moving the whole entry (~130
    /// bytes over TCP) out of its slot first was a copy for nothing.
    pub fn remove_with<R>(&mut self, cid: u16, f: impl FnOnce(&mut Entry<C, S>) -> R) -> Option<R> {
        let slot = self.slots.get_mut(cid as usize)?;
        let r = f(slot.as_mut()?);
        *slot = None;
        self.free.push(cid);
        Some(r)
    }

    /// Commands in flight (cancelled ones included, until they complete).
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The earliest deadline of a command in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|e| e.deadline).min()
    }

    /// The commands past their deadline at `now`.
    pub fn expired(&self, now: Instant) -> Vec<u16> {
        let late = |(i, e): (usize, &Option<Entry<C, S>>)| e.as_ref().filter(|e| e.deadline <= now).map(|_| i as u16);
        self.slots.iter().enumerate().filter_map(late).collect()
    }

    /// Every command's entry (the queue ended); every ID is free again.
    pub fn drain(&mut self) -> impl Iterator<Item = Entry<C, S>> + '_ {
        self.free = (0..self.slots.len()).rev().map(|i| i as u16).collect();
        self.slots.iter_mut().filter_map(|s| s.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ids_are_reused_only_after_their_command_is_over() {
        let t0 = Instant::now();
        let mut f: InFlight<&str, u8> = InFlight::new(2);
        assert_eq!(f.insert("a", t0 + Duration::from_secs(2), 1), Ok(0));
        assert_eq!(f.insert("b", t0 + Duration::from_secs(1), 2), Ok(1));
        assert_eq!(f.insert("c", t0, 3), Err("c"));
        assert_eq!((f.len(), f.poll_timeout()), (2, Some(t0 + Duration::from_secs(1))));
        // Given up on: the ID stays taken.
        assert_eq!(f.get_mut(0).and_then(|e| e.ctx.take()), Some("a"));
        assert_eq!(f.insert("c", t0, 3), Err("c"));
        assert_eq!(f.expired(t0 + Duration::from_secs(1)), vec![1]);
        assert_eq!(f.expired(t0 + Duration::from_secs(3)), vec![0, 1]);
        let e = f.remove(0).unwrap();
        assert_eq!((e.ctx, e.state), (None, 1));
        assert!(f.remove(0).is_none());
        assert_eq!(f.insert("c", t0, 3), Ok(0));
        // Taken from where it lies: the ID is free once `f` is done.
        assert_eq!(f.remove_with(1, |e| (e.ctx.take(), e.state)), Some((Some("b"), 2)));
        assert_eq!(f.remove_with(1, |_| ()), None);
        assert_eq!(f.insert("b", t0 + Duration::from_secs(1), 2), Ok(1));
        let left: Vec<_> = f.drain().map(|e| e.ctx).collect();
        assert_eq!(left, vec![Some("c"), Some("b")]);
        assert!(f.is_empty() && f.poll_timeout().is_none());
        assert_eq!(f.insert("d", t0, 4), Ok(0));
    }
}
