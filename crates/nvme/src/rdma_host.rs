//! One NVMe/RDMA queue on the host side, without verbs: command IDs,
//! capsules, completions matched to their commands, deadlines.
//!
//! The transport says where each command's data is ([`Data`]: in the
//! capsule, or a keyed descriptor of memory it registered), SENDs the
//! capsule [`RdmaHost::submit`] encodes, and feeds every completion it
//! RECEIVES to [`RdmaHost::completion`], which hands back the command's
//! context `C`. The data itself moves without the host's CPU (the
//! controller READs and WRITEs the registered memory), so nothing here
//! touches it. A completion for a command not in flight, or a command
//! past its deadline, ends the queue: later completions cannot be trusted.

use crate::in_flight::InFlight;
use crate::queue_entry::{sgl, Cqe, Keyed, Sgl, Sqe};
use std::time::{Duration, Instant};

/// Where a command's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// No data (a keyed descriptor of length 0, as Linux sends).
    None,
    /// `len` bytes follow the SQE in the capsule.
    InCapsule(u32),
    /// Host memory the controller reads or writes.
    Keyed(Keyed),
}

/// Why the queue ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaHostError {
    #[error("no free command id")]
    NoFreeCid,
    #[error("completion for command {0}, which is not in flight")]
    UnknownCommand(u16),
    #[error("a command timed out")]
    Timeout,
}

pub struct RdmaHost<C> {
    in_flight: InFlight<C, ()>,
    timeout: Duration,
}

impl<C> RdmaHost<C> {
    /// `depth` commands in flight at most (command IDs 0..depth).
    pub fn new(depth: u16, timeout: Duration) -> RdmaHost<C> {
        RdmaHost { in_flight: InFlight::new(depth as usize), timeout }
    }

    /// Give `sqe` a command ID and its data descriptor: the ID and the
    /// capsule's SQE (send it followed by the in-capsule data, if any).
    pub fn submit(&mut self, mut sqe: Sqe, data: Data, ctx: C, now: Instant) -> Result<(u16, Sqe), RdmaHostError> {
        let cid = self.in_flight.insert(ctx, now + self.timeout, ()).map_err(|_| RdmaHostError::NoFreeCid)?;
        sqe.set_cid(cid);
        match data {
            Data::None => sqe.set_keyed_sgl(Keyed { addr: 0, length: 0, key: 0, invalidate: false }),
            Data::InCapsule(len) => sqe.set_sgl(Sgl { addr: 0, length: len, kind: sgl::INCAPSULE }),
            Data::Keyed(k) => sqe.set_keyed_sgl(k),
        }
        Ok((cid, sqe))
    }

    /// A RECEIVED completion: its command's context (None for a cancelled one).
    pub fn completion(&mut self, b: &[u8]) -> Result<(Cqe, Option<C>), RdmaHostError> {
        let cqe = Cqe::parse(b);
        let e = self.in_flight.remove(cqe.cid).ok_or(RdmaHostError::UnknownCommand(cqe.cid))?;
        Ok((cqe, e.ctx))
    }

    /// Forget the caller of `cid` (it gave up); the ID stays taken.
    pub fn cancel(&mut self, cid: u16) -> Option<C> {
        self.in_flight.get_mut(cid)?.ctx.take()
    }

    /// Every command's context, for failing them when the queue ends.
    pub fn drain(&mut self) -> Vec<C> {
        self.in_flight.drain().filter_map(|e| e.ctx).collect()
    }

    /// The earliest deadline of a command in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.in_flight.poll_timeout()
    }

    /// Err once a command is past its deadline.
    pub fn check_timeout(&self, now: Instant) -> Result<(), RdmaHostError> {
        match self.poll_timeout() {
            Some(d) if now >= d => Err(RdmaHostError::Timeout),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue_entry::nvm;
    use crate::Status;

    #[test]
    fn ids_descriptors_and_completions() {
        let t0 = Instant::now();
        let mut h: RdmaHost<&str> = RdmaHost::new(2, Duration::from_secs(1));
        let (a, s) = h.submit(Sqe::new(nvm::FLUSH, 9, 1), Data::None, "a", t0).unwrap();
        assert_eq!((a, s.cid(), s.keyed_sgl().map(|k| k.length)), (0, 0, Some(0)));
        let k = Keyed { addr: 0x1000, length: 4096, key: 3, invalidate: false };
        let (b, s) = h.submit(Sqe::new(nvm::READ, 0, 1), Data::Keyed(k), "b", t0).unwrap();
        assert_eq!((b, s.keyed_sgl()), (1, Some(k)));
        assert_eq!(h.submit(Sqe::new(nvm::READ, 0, 1), Data::InCapsule(8), "c", t0), Err(RdmaHostError::NoFreeCid));
        let mut cqe = [0u8; 16];
        Cqe { result: 0, sq_head: 1, sq_id: 1, cid: 1, status: Status::SUCCESS }.write(&mut cqe);
        assert_eq!(h.completion(&cqe).unwrap().1, Some("b"));
        assert_eq!(h.completion(&cqe), Err(RdmaHostError::UnknownCommand(1)));
        let (c, s) = h.submit(Sqe::new(nvm::WRITE, 0, 1), Data::InCapsule(512), "c", t0).unwrap();
        assert_eq!((c, s.sgl().kind, s.sgl().length), (1, sgl::INCAPSULE, 512));
        assert_eq!(h.cancel(0), Some("a"));
        assert_eq!(h.check_timeout(t0 + Duration::from_secs(2)), Err(RdmaHostError::Timeout));
        assert_eq!(h.drain(), vec!["c"]);
    }
}
